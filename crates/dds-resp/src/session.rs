//! Connection-level commands every RESP server of the project answers the same way (`HELLO`,
//! `AUTH`, `CLIENT`), the per-connection state they change, and argument helpers.

use crate::Reply;

/// Per-connection state the commands change.
#[derive(Default)]
pub struct Session {
    /// Connection id (CLIENT ID).
    pub id: u64,
    /// Authenticated (or no password set).
    pub authed: bool,
    /// CLIENT SETNAME.
    pub name: Option<Vec<u8>>,
    /// RESP3 (after `HELLO 3`).
    pub resp3: bool,
}

/// An argument as lowercase text (command and option names).
pub fn lower(a: &[u8]) -> String {
    String::from_utf8_lossy(a).to_ascii_lowercase()
}

/// An argument as Redis parses integers (no `+`, no leading zeros, no `-0`).
pub fn int_arg(a: &[u8]) -> Option<i64> {
    let s = std::str::from_utf8(a).ok()?;
    if s.is_empty() || s.starts_with('+') || (s.len() > 1 && s.starts_with('0')) || s == "-0" {
        return None;
    }
    s.parse().ok()
}

/// `CLIENT SETNAME|GETNAME|ID|SETINFO`.
pub fn client(s: &mut Session, r: &mut Reply<'_>, argv: &[&[u8]]) {
    let sub = lower(argv[1]);
    match (sub.as_str(), argv.len()) {
        ("setname", 3) => {
            if argv[2].iter().any(|&b| b <= b' ' || b > b'~') {
                r.error("ERR Client names cannot contain spaces, newlines or special characters.");
            } else {
                s.name = (!argv[2].is_empty()).then(|| argv[2].to_vec());
                r.ok();
            }
        }
        ("getname", 2) => match &s.name {
            Some(n) => r.bulk(n),
            None => r.null(),
        },
        ("id", 2) => r.int(s.id as i64),
        ("setinfo", 4) => r.ok(),
        ("setname" | "getname" | "id" | "setinfo", _) => r.error(&format!(
            "ERR wrong number of arguments for 'client|{sub}' command"
        )),
        _ => r.error(&format!(
            "ERR unknown subcommand '{}'. Try CLIENT HELP.",
            String::from_utf8_lossy(argv[1])
        )),
    }
}

/// `AUTH [default] password` against `requirepass` (compared in constant time).
pub fn auth(s: &mut Session, password: Option<&str>, r: &mut Reply<'_>, argv: &[&[u8]]) {
    let given = match argv.len() {
        2 => argv[1],
        3 if argv[1] == b"default" => argv[2],
        3 => {
            r.error("WRONGPASS invalid username-password pair or user is disabled.");
            return;
        }
        _ => {
            r.error("ERR syntax error");
            return;
        }
    };
    match password {
        None => r.error(
            "ERR AUTH <password> called without any password configured for the default user. Are you sure your configuration is correct?",
        ),
        Some(p) if constant_time_eq(p.as_bytes(), given) => {
            s.authed = true;
            r.ok();
        }
        Some(_) => r.error("WRONGPASS invalid username-password pair or user is disabled."),
    }
}

/// Equality whose time does not depend on where the inputs differ.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// `HELLO [protover [AUTH user pass] [SETNAME name]]`: switches RESP2/RESP3.
pub fn hello(s: &mut Session, password: Option<&str>, r: &mut Reply<'_>, argv: &[&[u8]]) {
    let mut i = 1;
    let mut proto = if s.resp3 { 3 } else { 2 };
    if let Some(v) = argv.get(1) {
        match int_arg(v) {
            Some(p @ (2 | 3)) => proto = p,
            Some(_) => {
                r.error("NOPROTO sorry, this protocol version is not supported.");
                return;
            }
            None => {
                r.error("ERR Protocol version is not an integer or out of range");
                return;
            }
        }
        i = 2;
    }
    while i < argv.len() {
        let o = lower(argv[i]);
        if o == "auth" && i + 2 < argv.len() {
            let mut sink = Vec::new();
            let mut rr = Reply::new(&mut sink);
            auth(s, password, &mut rr, &[b"auth", argv[i + 1], argv[i + 2]]);
            if !s.authed {
                r.error("WRONGPASS invalid username-password pair or user is disabled.");
                return;
            }
            i += 3;
        } else if o == "setname" && i + 1 < argv.len() {
            s.name = Some(argv[i + 1].to_vec());
            i += 2;
        } else {
            r.error(&format!(
                "ERR Syntax error in HELLO option '{}'",
                String::from_utf8_lossy(argv[i])
            ));
            return;
        }
    }
    if password.is_some() && !s.authed {
        r.error("NOAUTH HELLO must be called with the client already authenticated, otherwise the HELLO <proto> AUTH <user> <pass> option can be used to authenticate the client and select the RESP protocol version at the same time");
        return;
    }
    s.resp3 = proto == 3;
    let mut r = Reply::with_protocol(r.out_mut(), s.resp3);
    r.map(7);
    for (k, v) in [("server", "redis"), ("version", "7.0.0")] {
        r.bulk(k.as_bytes());
        r.bulk(v.as_bytes());
    }
    r.bulk(b"proto");
    r.int(proto);
    r.bulk(b"id");
    r.int(s.id as i64);
    for (k, v) in [("mode", "standalone"), ("role", "master")] {
        r.bulk(k.as_bytes());
        r.bulk(v.as_bytes());
    }
    r.bulk(b"modules");
    r.array(0);
}
