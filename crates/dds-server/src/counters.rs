//! [`counters!`](crate::counters): a struct of atomic counters and its snapshot type, written
//! once.

/// Declares a struct of `AtomicU64` counters and a plain snapshot struct of the same fields
/// (`Serialize`, `Debug`, `Clone`, `Copy`, `Default`, `PartialEq`):
///
/// ```
/// dds_server::counters! {
///     /// What a proxy did.
///     pub struct ProxyCounters => ProxyStats {
///         /// Requests served.
///         requests,
///         /// Bytes sent.
///         bytes_out,
///     }
/// }
/// let c = ProxyCounters::default();
/// c.add(&c.requests, 2);
/// assert_eq!(c.snapshot().requests, 2);
/// ```
#[macro_export]
macro_rules! counters {
    (
        $(#[$meta:meta])*
        $vis:vis struct $name:ident => $snap:ident {
            $( $(#[$fmeta:meta])* $field:ident ),* $(,)?
        }
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
        $vis struct $snap {
            $( $(#[$fmeta])* pub $field: u64, )*
        }

        impl $name {
            /// Adds `n` to a counter.
            #[inline]
            pub fn add(&self, counter: &::std::sync::atomic::AtomicU64, n: u64) {
                counter.fetch_add(n, ::std::sync::atomic::Ordering::Relaxed);
            }

            /// The counters now.
            pub fn snapshot(&self) -> $snap {
                $snap {
                    $( $field: self.$field.load(::std::sync::atomic::Ordering::Relaxed), )*
                }
            }
        }
    };
}
