//! The values of `tasks.split`, shared by every world's task generator:
//! `train`, `val` (the training distribution in new scenes or layouts, or,
//! under LIBERO's protocol, held-out initial states of the train tasks),
//! `unseen` (held-out combinations) and `test` (held-out initial states of
//! the train tasks, disjoint from val's: LIBERO's evaluation protocol). What
//! "new" and "held out" mean is the world's business; the names are the
//! contract.
//!
//! ```
//! use embodyflow_schemas::Split;
//! let split: Split = "val".parse().unwrap();
//! assert_eq!(split, Split::Val);
//! assert_eq!(split.to_string(), "val");
//! assert_eq!("test".parse::<Split>().unwrap(), Split::Test);
//! assert!("dev".parse::<Split>().is_err());
//! ```

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// A data split.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Split {
    /// Training tasks.
    Train,
    /// The training distribution in new scenes (seen task types and combinations).
    Val,
    /// Held-out combinations (and, where a world has them, phrasings).
    Unseen,
    /// Held-out initial states of the training tasks (LIBERO's protocol;
    /// only worlds that draw initial states write it).
    Test,
}

/// A split name that is not `train`, `val`, `unseen` or `test`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown split `{name}`; expected one of: train, val, unseen, test")]
pub struct UnknownSplit {
    /// The name given.
    pub name: String,
}

impl Split {
    /// Every split.
    pub const ALL: [Split; 4] = [Split::Train, Split::Val, Split::Unseen, Split::Test];

    /// `train`, `val`, `unseen` or `test`.
    pub fn as_str(self) -> &'static str {
        match self {
            Split::Train => "train",
            Split::Val => "val",
            Split::Unseen => "unseen",
            Split::Test => "test",
        }
    }
}

impl fmt::Display for Split {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Split {
    type Err = UnknownSplit;
    fn from_str(name: &str) -> Result<Split, UnknownSplit> {
        Split::ALL
            .into_iter()
            .find(|split| split.as_str() == name)
            .ok_or_else(|| UnknownSplit {
                name: name.to_string(),
            })
    }
}
