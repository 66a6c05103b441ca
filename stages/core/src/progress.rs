//! Progress bars for long loops (indicatif, on stderr; hidden when stderr is
//! not a terminal, so logs of batch jobs stay clean).
//!
//! ```
//! let bar = embodyflow_core::progress::bar(3, "scoring");
//! for _ in 0..3 { bar.inc(1); }
//! bar.finish_and_clear();
//! ```

use indicatif::{ProgressBar, ProgressStyle};

/// A bar over `len` items labelled `label`.
pub fn bar(len: u64, label: &str) -> ProgressBar {
    let bar = ProgressBar::new(len);
    bar.set_style(
        ProgressStyle::with_template("{msg:>14} [{elapsed_precise}] {wide_bar} {human_pos}/{human_len} ({per_sec}, eta {eta})")
            .expect("valid template"),
    );
    bar.set_message(label.to_string());
    bar
}
