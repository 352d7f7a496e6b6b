//! The readiness backend: epoll through `mio`. A connection is read until a read would block
//! (edge-triggered) and written until a write would block; every read and write is a system
//! call.

use std::io;
use std::net::TcpStream;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::time::Duration;

use mio::net::TcpListener;
use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token};

use crate::conn::{Conn, ReadOutcome};
use crate::event_loop::{Core, Input};
use crate::{ConnId, Service};

const LISTENER: Token = Token(usize::MAX);
const WAKE: Token = Token(usize::MAX - 1);

pub(crate) struct Epoll {
    poll: Poll,
    events: Events,
    listener: Option<TcpListener>,
}

impl Epoll {
    pub(crate) fn new(listener: std::net::TcpListener, wake: Option<RawFd>) -> io::Result<Self> {
        let mut listener = TcpListener::from_std(listener);
        let poll = Poll::new()?;
        poll.registry()
            .register(&mut listener, LISTENER, Interest::READABLE)?;
        if let Some(fd) = wake {
            poll.registry()
                .register(&mut SourceFd(&fd), WAKE, Interest::READABLE)?;
        }
        Ok(Epoll {
            poll,
            events: Events::with_capacity(1024),
            listener: Some(listener),
        })
    }

    pub(crate) fn wait(&mut self, timeout: Duration) -> io::Result<()> {
        self.poll.poll(&mut self.events, Some(timeout))
    }

    pub(crate) fn dispatch<S: Service>(&self, core: &mut Core<S>) {
        for ev in self.events.iter() {
            match ev.token() {
                LISTENER => self.accept(core),
                WAKE => {}
                Token(t) => core.ready_io(
                    t as u32,
                    ev.is_readable() || ev.is_read_closed() || ev.is_error(),
                    ev.is_writable() || ev.is_write_closed() || ev.is_error(),
                ),
            }
        }
    }

    fn accept<S: Service>(&self, core: &mut Core<S>) {
        loop {
            let Some(listener) = self.listener.as_ref() else {
                return;
            };
            let (stream, peer) = match listener.accept() {
                Ok(x) => x,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    return;
                }
            };
            let stream = TcpStream::from(OwnedFd::from(stream));
            let Some(id) = core.next_id() else {
                core.reject(stream);
                continue;
            };
            if let Err(e) = self.poll.registry().register(
                &mut SourceFd(&stream.as_raw_fd()),
                Token(id.slot as usize),
                Interest::READABLE | Interest::WRITABLE,
            ) {
                tracing::warn!(error = %e, %peer, "cannot register a connection");
                continue;
            }
            core.admit(id, stream);
        }
    }

    pub(crate) fn read<'a, T>(&mut self, c: &mut Conn<T>, scratch: &'a mut [u8]) -> Input<'a> {
        match c.read(scratch) {
            ReadOutcome::Data(n) => Input::Data(&scratch[..n]),
            ReadOutcome::WouldBlock => Input::WouldBlock,
            ReadOutcome::Closed => Input::Closed,
        }
    }

    pub(crate) fn flush<T>(&mut self, c: &mut Conn<T>, keep: usize) {
        c.flush(keep);
    }

    pub(crate) fn close(&mut self, stream: TcpStream, _id: ConnId) {
        let _ = self
            .poll
            .registry()
            .deregister(&mut SourceFd(&stream.as_raw_fd()));
    }

    pub(crate) fn stop_accepting(&mut self) {
        if let Some(mut l) = self.listener.take() {
            let _ = self.poll.registry().deregister(&mut l);
        }
    }
}
