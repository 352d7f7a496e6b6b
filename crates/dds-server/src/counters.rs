//! [`counters!`](crate::counters): a struct of atomic counters and its snapshot type, written
//! once.

/// Declares a struct of `AtomicU64` counters and a plain snapshot struct of the same fields
/// (`Serialize`, `Deserialize`, `Debug`, `Clone`, `Copy`, `Default`, `PartialEq`), plus
/// snapshot-only fields (gauges the caller fills) in an optional `extra` block. The crate
/// using it depends on `serde`.
///
/// ```
/// dds_server::counters! {
///     /// What a proxy did.
///     pub struct ProxyCounters => pub struct ProxyStats {
///         /// Requests served.
///         requests,
///         /// Bytes sent.
///         bytes_out,
///     }
///     extra {
///         /// Bytes of buffers in use now.
///         memory_bytes: u64,
///     }
/// }
/// let c = ProxyCounters::default();
/// c.add(&c.requests, 2);
/// let s = ProxyStats { memory_bytes: 7, ..c.snapshot() };
/// assert_eq!((s.requests, s.memory_bytes), (2, 7));
/// ```
#[macro_export]
macro_rules! counters {
    (
        $(#[$meta:meta])*
        $vis:vis struct $name:ident => $svis:vis struct $snap:ident {
            $( $(#[$fmeta:meta])* $field:ident ),* $(,)?
        }
        $( extra { $( $(#[$xmeta:meta])* $xfield:ident : $xty:ty ),* $(,)? } )?
    ) => {
        $(#[$meta])*
        #[derive(Debug, Default)]
        $vis struct $name {
            $( $(#[$fmeta])* pub $field: ::std::sync::atomic::AtomicU64, )*
        }

        $(#[$meta])*
        ///
        /// (A snapshot of the counters.)
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ::serde::Serialize, ::serde::Deserialize)]
        $svis struct $snap {
            $( $(#[$fmeta])* pub $field: u64, )*
            $( $( $(#[$xmeta])* pub $xfield: $xty, )* )?
        }

        impl $name {
            /// Adds `n` to a counter.
            #[inline]
            pub fn add(&self, counter: &::std::sync::atomic::AtomicU64, n: u64) {
                counter.fetch_add(n, ::std::sync::atomic::Ordering::Relaxed);
            }

            /// The counters now (the snapshot's other fields at their defaults, for the
            /// caller to fill).
            #[allow(clippy::needless_update)]
            pub fn snapshot(&self) -> $snap {
                $snap {
                    $( $field: self.$field.load(::std::sync::atomic::Ordering::Relaxed), )*
                    ..::std::default::Default::default()
                }
            }
        }
    };
}
