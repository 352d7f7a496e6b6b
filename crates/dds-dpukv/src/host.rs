//! The host side: the processing-engine threads ([`worker`]), the host's end of the KV queue
//! pairs in its shared memory ([`queue`]) and the host process ([`node`]), which owns the
//! store and the queue region.

pub mod node;
pub mod queue;
pub mod worker;
