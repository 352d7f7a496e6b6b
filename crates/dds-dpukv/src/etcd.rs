//! Endpoint registration in etcd (`docs/dpu-kv.md` §5), as MICA and DPU-KV publish their
//! endpoints: one lease per process, kept alive while the process runs, so the endpoints of a
//! killed process disappear when the lease runs out. Uses etcd's v3 JSON gateway.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, Context, Result};
use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;

use crate::cluster::Endpoint;

fn post(
    agent: &ureq::Agent,
    url: &str,
    path: &str,
    body: serde_json::Value,
) -> Result<serde_json::Value> {
    let resp = agent
        .post(&format!("{}{path}", url.trim_end_matches('/')))
        .send_json(body)
        .with_context(|| format!("etcd {path}"))?;
    resp.into_json().context("etcd reply")
}

/// The key of an endpoint.
pub fn key(cluster: &str, e: &Endpoint) -> String {
    format!("/dds/dpukv/{cluster}/{}", e.id)
}

/// A registration: drop (or `stop`) revokes it.
pub struct Registration {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Registration {
    /// Registers `endpoints` (value: the endpoint as JSON plus the design) under a lease of
    /// `ttl` seconds and keeps it alive from a thread.
    pub fn start(
        url: &str,
        cluster: &str,
        design: &str,
        endpoints: &[Endpoint],
        ttl: u64,
    ) -> Result<Registration> {
        let agent = ureq::AgentBuilder::new()
            .timeout(Duration::from_secs(3))
            .build();
        let grant = post(
            &agent,
            url,
            "/v3/lease/grant",
            serde_json::json!({ "TTL": ttl }),
        )?;
        let id = grant["ID"]
            .as_str()
            .map(str::to_string)
            .or_else(|| grant["ID"].as_i64().map(|v| v.to_string()))
            .ok_or_else(|| anyhow!("etcd lease grant: no ID in {grant}"))?;
        for e in endpoints {
            let mut v = serde_json::to_value(e)?;
            v["design"] = serde_json::Value::from(design);
            post(
                &agent,
                url,
                "/v3/kv/put",
                serde_json::json!({
                    "key": B64.encode(key(cluster, e)),
                    "value": B64.encode(v.to_string()),
                    "lease": id,
                }),
            )?;
        }
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let url = url.to_string();
        let thread = std::thread::Builder::new()
            .name("etcd-lease".into())
            .spawn(move || {
                let step = Duration::from_millis((ttl * 1000 / 3).max(200));
                let mut waited = Duration::ZERO;
                while !s.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(50));
                    waited += Duration::from_millis(50);
                    if waited < step {
                        continue;
                    }
                    waited = Duration::ZERO;
                    if let Err(e) = post(
                        &agent,
                        &url,
                        "/v3/lease/keepalive",
                        serde_json::json!({ "ID": id }),
                    ) {
                        tracing::warn!(error = %e, "etcd keepalive failed");
                    }
                }
                let _ = post(
                    &agent,
                    &url,
                    "/v3/lease/revoke",
                    serde_json::json!({ "ID": id }),
                );
            })?;
        Ok(Registration {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The endpoints registered for `cluster` (what a client looks up).
pub fn lookup(url: &str, cluster: &str) -> Result<Vec<serde_json::Value>> {
    let agent = ureq::AgentBuilder::new()
        .timeout(Duration::from_secs(3))
        .build();
    let prefix = format!("/dds/dpukv/{cluster}/");
    let mut end = prefix.clone().into_bytes();
    *end.last_mut().expect("non-empty") += 1;
    let r = post(
        &agent,
        url,
        "/v3/kv/range",
        serde_json::json!({ "key": B64.encode(&prefix), "range_end": B64.encode(&end) }),
    )?;
    let mut out = Vec::new();
    for kv in r["kvs"].as_array().into_iter().flatten() {
        let v = B64.decode(kv["value"].as_str().unwrap_or(""))?;
        out.push(serde_json::from_slice(&v)?);
    }
    Ok(out)
}
