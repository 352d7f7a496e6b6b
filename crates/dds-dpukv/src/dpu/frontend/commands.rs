//! Command dispatch and the commands a front end answers itself (`PING`, `ECHO`, `HELLO`,
//! `CLIENT`, `CONFIG`, `COMMAND`, `CLUSTER`, `INFO`, ...): the command table clients route by and
//! Redis's reply to an unknown command. Data commands go on to the requests path.

use super::{Backend, FrontSession, FrontState};
use dds_resp::session::{client, hello, int_arg, lower};
use dds_resp::Reply;
use dds_server::{ConnId, Out};
use std::sync::atomic::Ordering;

impl FrontState {
    /// Runs one command of connection `id`; true when the connection closes after it.
    pub(super) fn command(
        &mut self,
        id: ConnId,
        s: &mut FrontSession,
        argv: &[&[u8]],
        used: usize,
        out: &mut Out<'_>,
    ) -> bool {
        self.stats.commands.fetch_add(1, Ordering::Relaxed);
        let Some(name) = COMMANDS
            .iter()
            .map(|c| c.0)
            .find(|n| n.as_bytes().eq_ignore_ascii_case(argv[0]))
        else {
            Reply::new(out).error(&unknown_command(argv));
            return false;
        };
        let arity: i32 = match name {
            "get" | "incr" | "decr" => 2,
            "set" | "incrby" | "decrby" => 3,
            "del" | "unlink" | "exists" | "mget" => -2,
            "mset" => -3,
            "ping" | "hello" | "command" | "info" | "quit" => -1,
            "dbsize" => 1,
            "echo" | "select" => 2,
            "client" | "cluster" | "config" => -2,
            _ => unreachable!("every command of the table has an arity"),
        };
        let n = argv.len() as i32;
        if (arity > 0 && n != arity) || (arity < 0 && n < -arity) || (name == "mset" && n % 2 == 0)
        {
            Reply::new(out).error(&format!(
                "ERR wrong number of arguments for '{name}' command"
            ));
            return false;
        }
        if matches!(
            name,
            "get"
                | "set"
                | "del"
                | "unlink"
                | "exists"
                | "incr"
                | "decr"
                | "incrby"
                | "decrby"
                | "mget"
                | "mset"
        ) {
            self.data(id, s, name, argv, used, out);
            return false;
        }
        let mut close = false;
        let mut r = Reply::with_protocol(out, s.session.resp3);
        match name {
            "ping" if argv.len() == 1 => r.simple("PONG"),
            "ping" if argv.len() == 2 => r.bulk(argv[1]),
            "ping" => r.error("ERR wrong number of arguments for 'ping' command"),
            "echo" => r.bulk(argv[1]),
            "quit" => {
                r.ok();
                close = true;
            }
            "hello" => hello(&mut s.session, None, &mut r, argv),
            "client" => client(&mut s.session, &mut r, argv),
            "select" => match int_arg(argv[1]) {
                Some(0) => r.ok(),
                Some(_) => r.error("ERR DB index is out of range"),
                None => r.error("ERR value is not an integer or out of range"),
            },
            "config" if argv[1].eq_ignore_ascii_case(b"get") => r.array(0),
            "config" => r.error("ERR CONFIG is not supported by dds dpukv"),
            "command" => command(&mut r, argv),
            "cluster" => self.cfg.cluster.command(&mut r, argv),
            "info" => {
                let s = &self.stats;
                let me = &self.cfg.cluster.endpoints[self.cfg.cluster.me];
                let text = format!(
                    "# Server\r\nredis_version:7.0.0\r\ndds_dpukv:1\r\nredis_mode:cluster\r\n\
                     role:{role}\r\ntcp_port:{port}\r\n\r\n# Clients\r\nconnected_clients:{cl}\r\n\r\n\
                     # Stats\r\ntotal_connections_received:{conns}\r\ntotal_commands_processed:{cmds}\r\n\
                     kvqp_requests:{req}\r\nraw_bytes:{raw}\r\ndma_bytes:{db}\r\ndma_ops:{dops}\r\n\
                     kvqp_batches:{bat}\r\nkvqp_empty_polls:{ep}\r\n\r\n# Cluster\r\ncluster_enabled:1\r\n",
                    role = me.role,
                    port = me.addr.port(),
                    cl = s.clients.load(Ordering::Relaxed),
                    conns = s.received(),
                    cmds = s.commands.load(Ordering::Relaxed),
                    req = s.kv_requests.load(Ordering::Relaxed),
                    raw = s.raw_bytes.load(Ordering::Relaxed),
                    db = s.dma_bytes.load(Ordering::Relaxed),
                    dops = s.dma_ops.load(Ordering::Relaxed),
                    bat = s.batches.load(Ordering::Relaxed),
                    ep = s.empty_polls.load(Ordering::Relaxed),
                );
                r.bulk(text.as_bytes());
            }
            "dbsize" => match &self.backend {
                Backend::Local(store) => r.int(store.len() as i64),
                Backend::Queues(_) => {
                    r.error("ERR DBSIZE is answered by the host's endpoints in this design")
                }
            },
            _ => unreachable!("data commands are dispatched above"),
        }
        close
    }
}

/// (name, arity, first key, last key, step) of the commands a front end serves, as Redis's
/// `COMMAND` lists them (cluster clients route by these key positions).
const COMMANDS: &[(&str, i64, i64, i64, i64)] = &[
    ("get", 2, 1, 1, 1),
    ("set", 3, 1, 1, 1),
    ("del", -2, 1, -1, 1),
    ("unlink", -2, 1, -1, 1),
    ("exists", -2, 1, -1, 1),
    ("mget", -2, 1, -1, 1),
    ("mset", -3, 1, -1, 2),
    ("incr", 2, 1, 1, 1),
    ("decr", 2, 1, 1, 1),
    ("incrby", 3, 1, 1, 1),
    ("decrby", 3, 1, 1, 1),
    ("ping", -1, 0, 0, 0),
    ("echo", 2, 0, 0, 0),
    ("quit", -1, 0, 0, 0),
    ("hello", -1, 0, 0, 0),
    ("client", -2, 0, 0, 0),
    ("select", 2, 0, 0, 0),
    ("config", -2, 0, 0, 0),
    ("command", -1, 0, 0, 0),
    ("cluster", -2, 0, 0, 0),
    ("info", -1, 0, 0, 0),
    ("dbsize", 1, 0, 0, 0),
];

fn command(r: &mut Reply<'_>, argv: &[&[u8]]) {
    match argv.get(1).map(|a| lower(a)).as_deref() {
        None => {
            r.array(COMMANDS.len());
            for &(name, arity, first, last, step) in COMMANDS {
                r.array(6);
                r.bulk(name.as_bytes());
                r.int(arity);
                r.array(0);
                r.int(first);
                r.int(last);
                r.int(step);
            }
        }
        Some("count") => r.int(COMMANDS.len() as i64),
        Some("docs") | Some("info") => r.array(0),
        Some(_) => r.error(&format!(
            "ERR unknown subcommand '{}'. Try COMMAND HELP.",
            String::from_utf8_lossy(argv[1])
        )),
    }
}

/// Redis's reply to an unknown command: its name and the start of its arguments (128 bytes
/// of each at most, until the list holds 128 bytes).
fn unknown_command(argv: &[&[u8]]) -> String {
    let text = |a: &[u8], n: usize| String::from_utf8_lossy(&a[..a.len().min(n)]).into_owned();
    let mut args = String::new();
    for a in &argv[1..] {
        if args.len() >= 128 {
            break;
        }
        args += &format!("'{}' ", text(a, 128 - args.len()));
    }
    format!(
        "ERR unknown command '{}', with args beginning with: {args}",
        text(argv[0], 128)
    )
}
