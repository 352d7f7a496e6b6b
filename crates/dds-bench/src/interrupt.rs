//! Ctrl-C during a benchmark that holds outside state (daemons, cgroups, device files): the
//! first SIGINT or SIGTERM only raises a flag that the benchmark looks at between steps, so it
//! stops early and its guards tear everything down; a second one ends the process at once.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use anyhow::{bail, Context, Result};

static FLAG: OnceLock<Arc<AtomicBool>> = OnceLock::new();

/// Installs the handlers (once per process).
pub fn install() -> Result<()> {
    if FLAG.get().is_some() {
        return Ok(());
    }
    let flag = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        // Order matters: the shutdown hook sees the flag before this signal sets it.
        signal_hook::flag::register_conditional_shutdown(sig, 130, flag.clone())
            .context("install the interrupt handler")?;
        signal_hook::flag::register(sig, flag.clone()).context("install the interrupt handler")?;
    }
    let _ = FLAG.set(flag);
    Ok(())
}

/// Whether an interrupt arrived.
pub fn requested() -> bool {
    FLAG.get().is_some_and(|f| f.load(Ordering::Relaxed))
}

/// Fails with "interrupted" once an interrupt arrived.
pub fn check() -> Result<()> {
    if requested() {
        bail!("interrupted: stopped early, everything it started is torn down");
    }
    Ok(())
}
