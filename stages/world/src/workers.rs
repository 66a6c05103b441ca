//! A world's own settings, which the stages and the registry pass on
//! without reading them ([`WorkerSettings`]): the Gymnasium bridge's
//! workers, from a stage's `bridge.*` keys. This crate, the stages and the
//! registry know no world's settings type; the world that reads one takes
//! it out.
//!
//! ```
//! use embodyflow_world::workers::WorkerSettings;
//! #[derive(Clone, Debug, PartialEq)]
//! struct Workers(usize);
//! let settings = WorkerSettings::of(Workers(2));
//! assert_eq!(settings.get::<Workers>(), Some(&Workers(2)));
//! assert_eq!(WorkerSettings::default().get::<Workers>(), None); // the world's defaults
//! ```

use std::any::Any;
use std::fmt;
use std::sync::Arc;

/// A world's own settings, passed on by the stages and the registry
/// without reading them: the Gymnasium bridge's workers (a stage's
/// `bridge.*` keys, `embodyflow_gym::BridgeKeys::settings`). A world takes
/// its own type out ([`WorkerSettings::get`]) and uses its defaults when
/// it is not there ([`WorkerSettings::default`], as in tests).
#[derive(Clone, Default)]
pub struct WorkerSettings(Option<Arc<dyn Any + Send + Sync>>);

impl WorkerSettings {
    /// Settings of type `T`, for the world that reads a `T`.
    pub fn of<T: Any + Send + Sync>(settings: T) -> WorkerSettings {
        WorkerSettings(Some(Arc::new(settings)))
    }

    /// The settings, when they are a `T`.
    pub fn get<T: Any>(&self) -> Option<&T> {
        self.0
            .as_deref()
            .and_then(|s| (s as &dyn Any).downcast_ref::<T>())
    }
}

impl fmt::Debug for WorkerSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self.0 {
            Some(_) => "WorkerSettings(..)",
            None => "WorkerSettings(default)",
        })
    }
}
