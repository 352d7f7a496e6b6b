//! Progress bars of the long runs (drawn on stderr when it is a terminal).

use indicatif::{ProgressBar, ProgressStyle};

/// A bar over `len` steps with a message naming the current step.
pub fn bar(len: u64, quiet: bool) -> ProgressBar {
    if quiet {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(len);
    bar.set_style(
        ProgressStyle::with_template("{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} {msg}")
            .expect("valid template"),
    );
    bar
}
