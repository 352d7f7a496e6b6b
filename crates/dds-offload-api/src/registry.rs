//! Offload apps by name.
//!
//! Applications register a constructor under a short name (`pagestore`, `kv`); the DPU daemon
//! resolves `--offload NAME` through the registry it is given, and treats any other value as
//! the path of a C plugin (`include/dds_offload.h`). The daemon itself names no application.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::api::OffloadApp;
use crate::plugin::{PluginApp, PluginError};

/// Options the DPU passes to an app's constructor.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AppOptions {
    /// Serve reads on the DPU even when the cache table has no entry for them (apps that can
    /// map a request to a file read directly). A benchmark mode: see `docs/security.md`.
    pub uncached: bool,
    /// Largest client message the app accepts (its default when `None`); a larger one gets
    /// the app's error reply and a close.
    pub max_message: Option<usize>,
    /// Largest host response the app accepts (its default when `None`).
    pub max_response: Option<usize>,
}

type Constructor = fn(&AppOptions) -> Arc<dyn OffloadApp>;

/// Why an app could not be resolved.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// Not a registered name, and not a path (no `/` and no `.so`).
    #[error("unknown offload app {name:?} (registered: {known}; a C plugin is given by its path)")]
    Unknown {
        /// The name asked for.
        name: String,
        /// The registered names, comma-separated.
        known: String,
    },
    /// Loading the C plugin failed.
    #[error("load offload plugin {path}: {source}")]
    Plugin {
        /// The plugin's path.
        path: String,
        /// Why.
        source: PluginError,
    },
}

/// Constructors of offload apps, by name.
#[derive(Clone, Default)]
pub struct Registry {
    apps: BTreeMap<&'static str, (Constructor, &'static str)>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.apps.keys()).finish()
    }
}

impl Registry {
    /// An empty registry.
    pub fn new() -> Self {
        Registry::default()
    }

    /// Registers `make` under `name` with a one-line description. A second registration of
    /// the same name replaces the first.
    pub fn register(&mut self, name: &'static str, about: &'static str, make: Constructor) {
        assert!(
            !name.is_empty() && !name.contains('/') && !name.ends_with(".so"),
            "offload app names are short words: {name:?}"
        );
        self.apps.insert(name, (make, about));
    }

    /// The registered names with their descriptions, sorted by name.
    pub fn names(&self) -> impl Iterator<Item = (&'static str, &'static str)> + '_ {
        self.apps.iter().map(|(n, (_, about))| (*n, *about))
    }

    /// The app registered as `name`, or the C plugin at the path `name` (a value containing
    /// `/` or ending in `.so`).
    pub fn resolve(
        &self,
        name: &str,
        opts: &AppOptions,
    ) -> Result<Arc<dyn OffloadApp>, RegistryError> {
        if let Some((make, _)) = self.apps.get(name) {
            return Ok(make(opts));
        }
        if name.contains('/') || name.ends_with(".so") {
            return PluginApp::load(name).map_err(|source| RegistryError::Plugin {
                path: name.to_string(),
                source,
            });
        }
        Err(RegistryError::Unknown {
            name: name.to_string(),
            known: self.apps.keys().copied().collect::<Vec<_>>().join(", "),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_names_list_the_registered_ones() {
        let mut r = Registry::new();
        r.register("b", "second", |_| unreachable!("not constructed"));
        r.register("a", "first", |_| unreachable!("not constructed"));
        assert_eq!(
            r.names().collect::<Vec<_>>(),
            [("a", "first"), ("b", "second")]
        );
        let e = r
            .resolve("c", &AppOptions::default())
            .err()
            .expect("unknown");
        assert!(matches!(e, RegistryError::Unknown { .. }));
        assert!(e.to_string().contains("a, b"), "{e}");
        let e = r
            .resolve("/nonexistent/lib.so", &AppOptions::default())
            .err()
            .expect("no such plugin");
        assert!(matches!(e, RegistryError::Plugin { .. }), "{e}");
    }
}
