//! Which backend a loop runs on: `Config::backend`, or for `Backend::Auto` the
//! `DDS_SERVER_BACKEND` environment variable (epoll when unset; `auto`: io_uring where the
//! kernel has it). (One test
//! in its own binary: it sets the process's environment.)

use std::io::ErrorKind;

use dds_server::{
    Backend, Budget, Completions, Config, ConnId, Out, Server, Service, Verdict, BACKEND_ENV,
};

struct Nothing;

impl Service for Nothing {
    type Session = ();
    fn open(&mut self, _id: ConnId) {}
    fn on_input(
        &mut self,
        _: ConnId,
        _: &mut (),
        input: &[u8],
        _: &mut Out<'_>,
    ) -> (usize, Verdict) {
        (input.len(), Verdict::Continue)
    }
    fn input_overflow(&mut self, _out: &mut Out<'_>) {}
    fn rejected(&self) -> &'static [u8] {
        b""
    }
    fn complete(&mut self, _done: &mut Completions<'_, ()>) {}
}

fn bind(backend: Backend) -> std::io::Result<Server<Nothing>> {
    Server::bind(
        "127.0.0.1:0".parse().unwrap(),
        Config {
            backend,
            ..Config::default()
        },
        Budget::new(1 << 20),
        Nothing,
    )
}

#[test]
fn the_backend_follows_the_config_then_the_environment_then_the_kernel() {
    std::env::remove_var(BACKEND_ENV);
    let uring_here = bind(Backend::Uring).is_ok();
    // Unset: epoll.
    assert_eq!(bind(Backend::Auto).unwrap().backend(), Backend::Epoll);
    std::env::set_var(BACKEND_ENV, "auto");
    let auto = bind(Backend::Auto).unwrap().backend();
    assert_eq!(
        auto,
        if uring_here {
            Backend::Uring
        } else {
            Backend::Epoll
        }
    );
    std::env::set_var(BACKEND_ENV, "epoll");
    assert_eq!(bind(Backend::Auto).unwrap().backend(), Backend::Epoll);
    if uring_here {
        // An explicit choice wins over the environment.
        assert_eq!(bind(Backend::Uring).unwrap().backend(), Backend::Uring);
        std::env::set_var(BACKEND_ENV, "uring");
        assert_eq!(bind(Backend::Auto).unwrap().backend(), Backend::Uring);
        assert_eq!(bind(Backend::Epoll).unwrap().backend(), Backend::Epoll);
    }
    std::env::set_var(BACKEND_ENV, "kqueue");
    let e = bind(Backend::Auto)
        .err()
        .expect("an unknown backend is refused");
    assert_eq!(e.kind(), ErrorKind::InvalidInput);
    assert!(e.to_string().contains(BACKEND_ENV), "{e}");
    std::env::remove_var(BACKEND_ENV);
}
