//! Value checks for configs: each names the dotted key, what was expected
//! and what was found, as a [`Error::BadValue`] (`config key `gae.gamma`:
//! expected a number in [0, 1], found 1.5`). A stage's
//! [`crate::config::StageConfig::validate`], a declared section's
//! [`crate::section::SectionConfig::check`] and the thread keys call them;
//! [`crate::config`] re-exports them.
//!
//! ```
//! use embodyflow_core::checks::{at_least, in_range, non_negative};
//! assert!(at_least("batch_rows", 1, 1).is_ok());
//! let err = in_range("gae.gamma", 1.5, 0.0, 1.0).unwrap_err().to_string();
//! assert_eq!(err, "config key `gae.gamma`: expected a number in [0, 1], found 1.5");
//! assert!(non_negative("ppo.kl_coef", 0.0).is_ok());
//! let err = non_negative("ppo.kl_coef", f64::NAN).unwrap_err().to_string();
//! assert_eq!(err, "config key `ppo.kl_coef`: expected a finite number of at least 0, found NaN");
//! ```
//!
//! [`either`] words the choices a message lists:
//!
//! ```
//! use embodyflow_core::checks::either;
//! assert_eq!(either(&["household", "tabletop", "gym"]), "household, tabletop or gym");
//! assert_eq!(either(&["gym"]), "gym");
//! ```

use std::fmt::Display;

use crate::error::{Error, Result};

/// A value check for [`crate::config::StageConfig::validate`]: unless `ok`, the error
/// `config key `key`: expected {expected}, found {found}`.
pub fn ensure(ok: bool, key: &str, expected: impl Display, found: impl Display) -> Result<()> {
    if ok {
        Ok(())
    } else {
        Err(Error::BadValue {
            key: key.to_string(),
            reason: format!("expected {expected}, found {found}"),
        })
    }
}

/// `value >= min` (a count or size).
pub fn at_least<T: PartialOrd + Display>(key: &str, value: T, min: T) -> Result<()> {
    let ok = value >= min;
    ensure(ok, key, format!("at least {min}"), value)
}

/// A finite number above 0 (a temperature, a learning rate, an epsilon).
pub fn positive(key: &str, value: f64) -> Result<()> {
    ensure(
        value.is_finite() && value > 0.0,
        key,
        "a finite number above 0",
        value,
    )
}

/// A finite number of at least 0 (a coefficient or clip that 0 turns off).
pub fn non_negative(key: &str, value: f64) -> Result<()> {
    ensure(
        value.is_finite() && value >= 0.0,
        key,
        "a finite number of at least 0",
        value,
    )
}

/// A finite number (a weight or threshold of either sign).
pub fn finite(key: &str, value: f64) -> Result<()> {
    ensure(value.is_finite(), key, "a finite number", value)
}

/// A number in the closed interval `[low, high]` (a probability: `[0, 1]`).
pub fn in_range(key: &str, value: f64, low: f64, high: f64) -> Result<()> {
    ensure(
        (low..=high).contains(&value),
        key,
        format!("a number in [{low}, {high}]"),
        value,
    )
}

/// The choices `names` as a message lists them: `a`, `a or b`, `a, b or c`.
pub fn either<S: AsRef<str>>(names: &[S]) -> String {
    match names {
        [] => String::new(),
        [one] => one.as_ref().to_string(),
        [init @ .., last] => {
            let init: Vec<&str> = init.iter().map(AsRef::as_ref).collect();
            format!("{} or {}", init.join(", "), last.as_ref())
        }
    }
}
