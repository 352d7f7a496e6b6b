//! Which backend a loop runs on: `Config::backend`, or for `Backend::Auto` the
//! `DDS_SERVER_BACKEND` environment variable (`auto` when unset: io_uring where the kernel
//! has it, epoll where io_uring is missing or refused; `epoll` forces epoll). (One test in its
//! own binary: it sets the process's environment.)

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
    let expected = if uring_here {
        Backend::Uring
    } else {
        Backend::Epoll
    };
    assert_eq!(bind(Backend::Auto).unwrap().backend(), expected);
    // Where the kernel refuses io_uring (seccomp, `kernel.io_uring_disabled`) or has none,
    // the default is epoll and a forced io_uring is an error.
    for errno in [libc::EPERM, libc::ENOSYS] {
        std::thread::spawn(move || {
            refuse_io_uring_setup(errno);
            let e = bind(Backend::Uring).err().expect("io_uring refused");
            assert_eq!(e.raw_os_error(), Some(errno));
            assert_eq!(bind(Backend::Auto).unwrap().backend(), Backend::Epoll);
        })
        .join()
        .unwrap();
    }
    std::env::set_var(BACKEND_ENV, "auto");
    assert_eq!(bind(Backend::Auto).unwrap().backend(), expected);
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

/// From now on, `io_uring_setup` fails with `errno` on this thread (a seccomp filter).
fn refuse_io_uring_setup(errno: i32) {
    let stmt = |code: u32, k: u32| libc::sock_filter {
        code: code as u16,
        jt: 0,
        jf: 0,
        k,
    };
    let filter = [
        // The system call's number (`seccomp_data.nr`, at offset 0).
        stmt(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, 0),
        libc::sock_filter {
            code: (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16,
            jt: 0,
            jf: 1,
            k: libc::SYS_io_uring_setup as u32,
        },
        stmt(
            libc::BPF_RET | libc::BPF_K,
            libc::SECCOMP_RET_ERRNO | errno as u32,
        ),
        stmt(libc::BPF_RET | libc::BPF_K, libc::SECCOMP_RET_ALLOW),
    ];
    let prog = libc::sock_fprog {
        len: filter.len() as u16,
        filter: filter.as_ptr().cast_mut(),
    };
    // SAFETY: plain prctl calls; the filter outlives the call that copies it.
    unsafe {
        assert_eq!(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), 0);
        assert_eq!(
            libc::prctl(
                libc::PR_SET_SECCOMP,
                libc::SECCOMP_MODE_FILTER,
                &prog as *const libc::sock_fprog
            ),
            0,
            "{}",
            std::io::Error::last_os_error()
        );
    }
}
