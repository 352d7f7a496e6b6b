//! `dds fsck`: checks a device's metadata without changing it: what the DPU would recover
//! (checkpoint generation, log records, files, directories) or exactly what is damaged.
//! Exit status 0 when the device opens cleanly, 1 when it is damaged.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Args;

#[derive(Args, Debug)]
pub struct FsckArgs {
    /// Device (block device or device file). It must not be in use by a running DPU.
    #[arg(long)]
    device: PathBuf,
    /// One JSON object.
    #[arg(long)]
    json: bool,
}

pub fn run(a: FsckArgs) -> Result<()> {
    let mut dev = dds_fs::UringDevice::open(&a.device, 8)
        .with_context(|| format!("open {} (is a DPU using it?)", a.device.display()))?;
    let report = dds_fs::check(&mut dev);
    if a.json {
        println!("{}", serde_json::to_string(&report)?);
    } else if report.damage.is_none() {
        println!(
            "{}: clean: checkpoint generation {}, {} log records replayed, {} files, {} directories",
            a.device.display(),
            report.generation,
            report.replayed,
            report.files,
            report.dirs
        );
    }
    if let Some(d) = report.damage {
        bail!(
            "{} is damaged: {d}\nThe DPU refuses to open it. Keep the image, and restore the \
             files from a copy or recreate them; nothing was changed.",
            a.device.display()
        );
    }
    Ok(())
}
