//! dds-testkit: test support shared by the tests of several DDS crates. A dev-dependency
//! only; nothing shipped depends on it.
//!
//! - [`alloc`]: the counting global allocator behind the no-allocation tests (a claim about a
//!   hot path that a test keeps true).
//! - [`resp`]: Redis protocol commands as clients send them.

pub mod alloc;
pub mod resp;
