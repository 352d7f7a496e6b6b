//! The calls of etcd's v3 API the monitor needs (`docs/osd-protocol.md`, "etcd as the
//! monitor"), through etcd's JSON gateway: reads, puts, compare-and-swap transactions, leases,
//! elections and watches.

use std::io::BufReader;
use std::time::Duration;

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use serde_json::{json, Value};

/// A failed etcd call.
#[derive(Debug, thiserror::Error)]
#[error("etcd {call}: {detail}")]
pub struct EtcdError {
    pub call: String,
    pub detail: String,
}

/// One key's value and revisions.
#[derive(Debug, Clone)]
pub struct Kv {
    pub key: String,
    pub value: Vec<u8>,
    pub mod_revision: i64,
}

/// A connection to one etcd endpoint (`http://IP:PORT`).
#[derive(Clone)]
pub struct Etcd {
    url: String,
    agent: ureq::Agent,
    /// For the calls that wait (campaign, watch): no overall timeout.
    waiting: ureq::Agent,
}

fn b64(s: impl AsRef<[u8]>) -> String {
    B64.encode(s)
}

/// An int64 of the gateway's JSON (a string or a number).
fn int(v: &Value) -> i64 {
    v.as_str()
        .and_then(|s| s.parse().ok())
        .or_else(|| v.as_i64())
        .unwrap_or(0)
}

fn decode_kv(v: &Value) -> Option<Kv> {
    let key = B64.decode(v["key"].as_str()?).ok()?;
    let value = B64.decode(v["value"].as_str().unwrap_or("")).ok()?;
    Some(Kv {
        key: String::from_utf8_lossy(&key).into_owned(),
        value,
        mod_revision: int(&v["mod_revision"]),
    })
}

/// The end of the range of keys starting with `prefix`.
fn prefix_end(prefix: &str) -> Vec<u8> {
    let mut end = prefix.as_bytes().to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

impl Etcd {
    pub fn new(url: &str) -> Etcd {
        Etcd {
            url: url.trim_end_matches('/').to_string(),
            agent: ureq::AgentBuilder::new()
                .timeout(Duration::from_secs(3))
                .build(),
            waiting: ureq::AgentBuilder::new()
                .timeout_connect(Duration::from_secs(3))
                .build(),
        }
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    fn post_with(&self, agent: &ureq::Agent, path: &str, body: Value) -> Result<Value, EtcdError> {
        let err = |detail: String| EtcdError {
            call: path.to_string(),
            detail,
        };
        let resp = agent
            .post(&format!("{}{path}", self.url))
            .send_json(body)
            .map_err(|e| err(e.to_string()))?;
        resp.into_json().map_err(|e| err(e.to_string()))
    }

    fn post(&self, path: &str, body: Value) -> Result<Value, EtcdError> {
        self.post_with(&self.agent, path, body)
    }

    /// The key's value, if it exists.
    pub fn get(&self, key: &str) -> Result<Option<Kv>, EtcdError> {
        let r = self.post("/v3/kv/range", json!({ "key": b64(key) }))?;
        Ok(r["kvs"]
            .as_array()
            .and_then(|a| a.first())
            .and_then(decode_kv))
    }

    /// Every key starting with `prefix`, and the store's revision.
    pub fn range_prefix(&self, prefix: &str) -> Result<(Vec<Kv>, i64), EtcdError> {
        let r = self.post(
            "/v3/kv/range",
            json!({ "key": b64(prefix), "range_end": b64(prefix_end(prefix)) }),
        )?;
        let kvs = r["kvs"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(decode_kv)
            .collect();
        Ok((kvs, int(&r["header"]["revision"])))
    }

    /// Puts `value` at `key`, under `lease` (0: none).
    pub fn put(&self, key: &str, value: &[u8], lease: i64) -> Result<(), EtcdError> {
        let mut body = json!({ "key": b64(key), "value": b64(value) });
        if lease != 0 {
            body["lease"] = Value::from(lease.to_string());
        }
        self.post("/v3/kv/put", body).map(|_| ())
    }

    /// Puts `value` at `key` if the key's mod revision is `mod_revision` (0: if the key does
    /// not exist); whether it did.
    pub fn put_if(&self, key: &str, value: &[u8], mod_revision: i64) -> Result<bool, EtcdError> {
        let compare = json!([{
            "key": b64(key),
            "target": "MOD",
            "result": "EQUAL",
            "mod_revision": mod_revision.to_string(),
        }]);
        let r = self.post(
            "/v3/kv/txn",
            json!({
                "compare": compare,
                "success": [{ "request_put": { "key": b64(key), "value": b64(value) } }],
            }),
        )?;
        Ok(r["succeeded"].as_bool().unwrap_or(false))
    }

    /// A new lease of `ttl` seconds; its id.
    pub fn grant(&self, ttl: u64) -> Result<i64, EtcdError> {
        let r = self.post("/v3/lease/grant", json!({ "TTL": ttl.to_string() }))?;
        match int(&r["ID"]) {
            0 => Err(EtcdError {
                call: "/v3/lease/grant".into(),
                detail: format!("no lease id in {r}"),
            }),
            id => Ok(id),
        }
    }

    /// Renews a lease; `false` when it expired already.
    pub fn keep_alive(&self, lease: i64) -> Result<bool, EtcdError> {
        let r = self.post("/v3/lease/keepalive", json!({ "ID": lease.to_string() }))?;
        Ok(int(&r["result"]["TTL"]) > 0)
    }

    pub fn revoke(&self, lease: i64) -> Result<(), EtcdError> {
        self.post("/v3/lease/revoke", json!({ "ID": lease.to_string() }))
            .map(|_| ())
    }

    /// Campaigns for the election `name` with `lease`; returns, once this campaigner leads,
    /// the key that holds the leadership (it exists while it leads).
    pub fn campaign(&self, name: &str, lease: i64, value: &[u8]) -> Result<String, EtcdError> {
        let r = self.post_with(
            &self.waiting,
            "/v3/election/campaign",
            json!({ "name": b64(name), "lease": lease.to_string(), "value": b64(value) }),
        )?;
        let key = r["leader"]["key"]
            .as_str()
            .and_then(|k| B64.decode(k).ok())
            .ok_or_else(|| EtcdError {
                call: "/v3/election/campaign".into(),
                detail: format!("no leader key in {r}"),
            })?;
        Ok(String::from_utf8_lossy(&key).into_owned())
    }

    /// Watches `key` from `revision` on: calls `each` with every new value until `each`
    /// returns false or the watch breaks (an error).
    pub fn watch(
        &self,
        key: &str,
        revision: i64,
        mut each: impl FnMut(&Kv) -> bool,
    ) -> Result<(), EtcdError> {
        let err = |detail: String| EtcdError {
            call: "/v3/watch".into(),
            detail,
        };
        let resp = self
            .waiting
            .post(&format!("{}/v3/watch", self.url))
            .send_json(json!({
                "create_request": { "key": b64(key), "start_revision": revision.to_string() }
            }))
            .map_err(|e| err(e.to_string()))?;
        let stream = serde_json::Deserializer::from_reader(BufReader::new(resp.into_reader()))
            .into_iter::<Value>();
        for msg in stream {
            let msg = msg.map_err(|e| err(e.to_string()))?;
            if msg.get("error").is_some() || msg["result"]["canceled"].as_bool() == Some(true) {
                return Err(err(format!("watch ended: {msg}")));
            }
            for ev in msg["result"]["events"].as_array().into_iter().flatten() {
                if let Some(kv) = decode_kv(&ev["kv"]) {
                    if !each(&kv) {
                        return Ok(());
                    }
                }
            }
        }
        Err(err("the watch stream ended".into()))
    }
}

/// A one-member etcd for tests and benchmarks (package etcd-server), its data in `dir`:
/// the command and its client URL. etcd cannot report a port it picked itself, so its client
/// and peer ports are free ones chosen here (our own daemons bind port 0 instead).
pub fn local_member(dir: &std::path::Path) -> std::io::Result<(std::process::Command, String)> {
    let port = || -> std::io::Result<u16> {
        Ok(std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port())
    };
    let url = format!("http://127.0.0.1:{}", port()?);
    let peer = format!("http://127.0.0.1:{}", port()?);
    let cmd = member(std::process::Command::new("etcd"), dir, &url, &peer);
    Ok((cmd, url))
}

/// `etcd` (the program `cmd` runs, e.g. `ip netns exec NS etcd`) as a single-member cluster
/// with its data in `dir`, serving clients at `url` and its peer port at `peer`.
pub fn member(
    mut cmd: std::process::Command,
    dir: &std::path::Path,
    url: &str,
    peer: &str,
) -> std::process::Command {
    cmd.arg("--data-dir")
        .arg(dir.join("etcd"))
        .args(["--listen-client-urls", url, "--advertise-client-urls", url])
        .args([
            "--listen-peer-urls",
            peer,
            "--initial-advertise-peer-urls",
            peer,
        ])
        .args(["--initial-cluster", &format!("default={peer}")])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    cmd
}

/// Waits until etcd answers at `url` (at most `timeout`).
pub fn wait_answers(url: &str, timeout: Duration) -> bool {
    let api = Etcd::new(url);
    let deadline = std::time::Instant::now() + timeout;
    while api.get("/").is_err() {
        if std::time::Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_ends() {
        assert_eq!(prefix_end("/a/"), b"/a0".to_vec());
        assert_eq!(prefix_end("a\u{7f}"), vec![b'a', 0x80]);
    }
}
