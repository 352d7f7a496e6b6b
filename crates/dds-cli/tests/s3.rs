//! `dds s3` on a real 3-OSD cluster (file mode), driven by the real awscli and boto3:
//! round trips compared byte for byte, ranged reads, listings with prefixes, delimiters and
//! pagination, multipart uploads, SigV4 refusals, S3's error codes, hostile HTTP peers, the data
//! surviving a restart of the gateway, and (etcd mode) the bucket index's shards, a bucket of
//! an earlier gateway's one-object index, and the gateway serving on through the `kill -9` of
//! an OSD.

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Output};

use common::{Guard, OsdCluster, DDS};

const ACCESS: &str = "DDSTESTACCESSKEY";
const SECRET: &str = "dds-test-secret-key-0123456789";

/// A 3-OSD cluster (16 PGs, 3 replicas, 256 MiB devices) and a gateway on it.
fn cluster(dir: &Path) -> OsdCluster {
    OsdCluster::start_sized(dir, &["host"; 3], 16, 3, "256M")
}

/// `dds s3` on the cluster's map, on port 0, with `args` (the keys unless given otherwise).
fn gateway(c: &OsdCluster, args: &[&str]) -> (Guard, SocketAddr) {
    let mut cmd = Command::new(DDS);
    cmd.arg("s3").arg("--map").arg(&c.map).args(args);
    if !args.iter().any(|a| a.starts_with("--config")) {
        cmd.args(["--access-key", ACCESS, "--secret-key", SECRET]);
    }
    let (g, addr) = common::spawn_listening(&mut cmd);
    (g, addr)
}

/// `aws --endpoint-url http://ADDR ARGS` with the gateway's credentials (or `secret`).
fn aws_with(addr: SocketAddr, secret: &str, dir: &Path, args: &[&str]) -> Output {
    Command::new("aws")
        .arg("--endpoint-url")
        .arg(format!("http://{addr}"))
        .args(args)
        .current_dir(dir)
        .env("AWS_ACCESS_KEY_ID", ACCESS)
        .env("AWS_SECRET_ACCESS_KEY", secret)
        .env("AWS_DEFAULT_REGION", "us-east-1")
        .env("AWS_CONFIG_FILE", dir.join("no-aws-config"))
        .env(
            "AWS_SHARED_CREDENTIALS_FILE",
            dir.join("no-aws-credentials"),
        )
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .output()
        .expect("aws (pip install awscli)")
}

fn aws(addr: SocketAddr, dir: &Path, args: &[&str]) -> String {
    let out = aws_with(addr, SECRET, dir, args);
    assert!(
        out.status.success(),
        "aws {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Bytes that differ at every offset a stripe or part boundary could misplace.
fn pattern(len: usize, seed: u32) -> Vec<u8> {
    (0..len as u32)
        .map(|i| (i.wrapping_mul(2_654_435_761).wrapping_add(seed) >> 13) as u8)
        .collect()
}

#[test]
fn awscli_round_trips_lists_multipart_and_survives_a_gateway_restart() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let c = cluster(d);
    // One stripe buffer: awscli's concurrent part uploads take turns.
    let (gw, addr) = gateway(&c, &["--stripe-buffers", "1"]);

    aws(addr, d, &["s3", "mb", "s3://photos"]);
    assert!(aws(addr, d, &["s3", "ls"]).contains("photos"));

    // A small object, an object of exactly one stripe plus one byte, and a 12 MiB one that
    // awscli uploads in two parts (8 MiB threshold and part size).
    let small = pattern(1000, 1);
    let stripe_plus = pattern((4 << 20) + 1, 2);
    let big = pattern(12 << 20, 3);
    std::fs::write(d.join("small.bin"), &small).unwrap();
    std::fs::write(d.join("stripe.bin"), &stripe_plus).unwrap();
    std::fs::write(d.join("big.bin"), &big).unwrap();
    aws(
        addr,
        d,
        &["s3", "cp", "small.bin", "s3://photos/2024/a.bin"],
    );
    aws(
        addr,
        d,
        &["s3", "cp", "stripe.bin", "s3://photos/2024/b.bin"],
    );
    aws(
        addr,
        d,
        &["s3", "cp", "big.bin", "s3://photos/2025/big.bin"],
    );
    aws(addr, d, &["s3", "cp", "small.bin", "s3://photos/top.bin"]);

    for (key, want) in [
        ("2024/a.bin", &small),
        ("2024/b.bin", &stripe_plus),
        ("2025/big.bin", &big),
    ] {
        let _ = std::fs::remove_file(d.join("out.bin"));
        aws(
            addr,
            d,
            &["s3", "cp", &format!("s3://photos/{key}"), "out.bin"],
        );
        assert!(std::fs::read(d.join("out.bin")).unwrap() == *want, "{key}");
    }

    // The multipart ETag is S3's: md5 of the parts' md5s, dash, the part count.
    let head = aws(
        addr,
        d,
        &[
            "s3api",
            "head-object",
            "--bucket",
            "photos",
            "--key",
            "2025/big.bin",
        ],
    );
    let head: serde_json::Value = serde_json::from_str(&head).unwrap();
    assert_eq!(head["ContentLength"], 12 << 20);
    assert!(head["ETag"].as_str().unwrap().ends_with("-2\""), "{head}");

    // A ranged read across the stripe boundary of the big object and across its part
    // boundary (8 MiB).
    for (lo, hi) in [
        ((4 << 20) - 5, (4 << 20) + 5),
        ((8 << 20) - 3, (8 << 20) + 100_000),
    ] {
        let range = format!("bytes={lo}-{hi}");
        aws(
            addr,
            d,
            &[
                "s3api",
                "get-object",
                "--bucket",
                "photos",
                "--key",
                "2025/big.bin",
                "--range",
                &range,
                "range.bin",
            ],
        );
        assert!(std::fs::read(d.join("range.bin")).unwrap() == big[lo..=hi]);
    }

    // Listings: the whole bucket, a prefix, and the common prefixes of a delimiter.
    let all = aws(addr, d, &["s3", "ls", "--recursive", "s3://photos"]);
    let keys: Vec<&str> = all
        .lines()
        .filter_map(|l| l.split_whitespace().nth(3))
        .collect();
    assert_eq!(
        keys,
        ["2024/a.bin", "2024/b.bin", "2025/big.bin", "top.bin"]
    );
    assert!(
        all.contains(&format!(" {} 2025/big.bin", 12 << 20)),
        "{all}"
    );
    let under = aws(addr, d, &["s3", "ls", "s3://photos/2024/"]);
    assert_eq!(under.lines().count(), 2, "{under}");
    let top = aws(addr, d, &["s3", "ls", "s3://photos/"]);
    assert!(
        top.contains("PRE 2024/") && top.contains("PRE 2025/"),
        "{top}"
    );
    assert!(top.contains("top.bin") && !top.contains("a.bin"), "{top}");

    // Server-side copy and move (CopyObject, then DeleteObject) of a two-stripe object, and of
    // the 12 MiB one, which awscli copies as a multipart upload of UploadPartCopy ranges.
    for (from, want) in [
        ("s3://photos/2024/b.bin", &stripe_plus),
        ("s3://photos/2025/big.bin", &big),
    ] {
        let (copy, moved) = ("s3://photos/copy.bin", "s3://photos/moved.bin");
        aws(addr, d, &["s3", "cp", from, copy]);
        aws(addr, d, &["s3", "mv", copy, moved]);
        let _ = std::fs::remove_file(d.join("out.bin"));
        aws(addr, d, &["s3", "cp", moved, "out.bin"]);
        assert!(std::fs::read(d.join("out.bin")).unwrap() == *want, "{from}");
    }
    aws(addr, d, &["s3", "rm", "s3://photos/moved.bin"]);

    // Missing key: 404 NoSuchKey; wrong secret: 403 SignatureDoesNotMatch.
    let missing = aws_with(
        addr,
        SECRET,
        d,
        &[
            "s3api",
            "get-object",
            "--bucket",
            "photos",
            "--key",
            "nope",
            "x.bin",
        ],
    );
    assert!(!missing.status.success());
    assert!(String::from_utf8_lossy(&missing.stderr).contains("NoSuchKey"));
    let forged = aws_with(addr, "not-the-secret", d, &["s3", "ls", "s3://photos"]);
    assert!(!forged.status.success());
    assert!(
        String::from_utf8_lossy(&forged.stderr).contains("SignatureDoesNotMatch"),
        "{}",
        String::from_utf8_lossy(&forged.stderr)
    );

    // A restart of the gateway (now from a config file) finds everything.
    drop(gw);
    let conf = d.join("s3.toml");
    std::fs::write(
        &conf,
        format!("access-key = \"{ACCESS}\"\nsecret-key = \"{SECRET}\"\n"),
    )
    .unwrap();
    let (_gw, addr) = gateway(&c, &["--config", conf.to_str().unwrap()]);
    let again = aws(addr, d, &["s3", "ls", "--recursive", "s3://photos"]);
    assert_eq!(again, all);
    let _ = std::fs::remove_file(d.join("out.bin"));
    aws(
        addr,
        d,
        &["s3", "cp", "s3://photos/2025/big.bin", "out.bin"],
    );
    assert!(std::fs::read(d.join("out.bin")).unwrap() == big);

    // Removing objects and the bucket.
    let rb = aws_with(addr, SECRET, d, &["s3", "rb", "s3://photos"]);
    assert!(String::from_utf8_lossy(&rb.stderr).contains("BucketNotEmpty"));
    aws(addr, d, &["s3", "rm", "--recursive", "s3://photos/"]);
    assert_eq!(
        aws(addr, d, &["s3", "ls", "--recursive", "s3://photos"]),
        ""
    );
    aws(addr, d, &["s3", "rb", "s3://photos"]);
    assert!(!aws(addr, d, &["s3", "ls"]).contains("photos"));
}

/// The boto3 script: every assertion is in Python; it prints `boto3 ok` at its end.
const BOTO3: &str = r#"
import sys, time, hashlib, boto3, botocore
from botocore.config import Config
from botocore.exceptions import ClientError

endpoint, access, secret = sys.argv[1:4]
def client(secret):
    return boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=access,
                        aws_secret_access_key=secret, region_name="us-east-1",
                        config=Config(retries={"max_attempts": 1}))
s3 = client(secret)

def code(f):
    # The error a request gets. A 503 (the cluster did not answer in time, on a loaded
    # machine) is retried, as S3 clients retry it; the client itself retries nothing.
    for attempt in range(6):
        try:
            f()
        except ClientError as e:
            got = e.response["Error"]["Code"], e.response["ResponseMetadata"]["HTTPStatusCode"]
            if got[1] == 503 and attempt < 5:
                print("retrying after", got, file=sys.stderr)
                time.sleep(0.5)
                continue
            return got
        raise AssertionError("no error")

s3.create_bucket(Bucket="docs")
assert code(lambda: s3.create_bucket(Bucket="docs"))[0] == "BucketAlreadyOwnedByYou"
assert code(lambda: s3.create_bucket(Bucket="Bad_Name"))[1] == 400
assert [b["Name"] for b in s3.list_buckets()["Buckets"]] == ["docs"]
s3.head_bucket(Bucket="docs")
assert code(lambda: s3.head_bucket(Bucket="nobucket"))[1] == 404
assert code(lambda: s3.get_object(Bucket="nobucket", Key="k"))[0] == "NoSuchBucket"

body = bytes((i * 7 + 3) % 251 for i in range(300_000))
r = s3.put_object(Bucket="docs", Key="a/b/c.txt", Body=body, ContentType="text/plain",
                  Metadata={"color": "blue", "owner": "ops"})
assert r["ETag"] == '"%s"' % hashlib.md5(body).hexdigest()
g = s3.get_object(Bucket="docs", Key="a/b/c.txt")
assert g["Body"].read() == body
assert g["ContentType"] == "text/plain"
assert g["Metadata"] == {"color": "blue", "owner": "ops"}
assert g["ContentLength"] == len(body)
g = s3.get_object(Bucket="docs", Key="a/b/c.txt", Range="bytes=1000-1999")
assert g["Body"].read() == body[1000:2000]
assert g["ContentRange"] == "bytes 1000-1999/%d" % len(body)
assert g["ResponseMetadata"]["HTTPStatusCode"] == 206
g = s3.get_object(Bucket="docs", Key="a/b/c.txt", Range="bytes=-10")
assert g["Body"].read() == body[-10:]
assert code(lambda: s3.get_object(Bucket="docs", Key="a/b/c.txt",
                                  Range="bytes=999999999-"))[1] == 416
h = s3.head_object(Bucket="docs", Key="a/b/c.txt")
assert h["ContentLength"] == len(body) and h["Metadata"]["color"] == "blue"
assert code(lambda: s3.get_object(Bucket="docs", Key="missing")) == ("NoSuchKey", 404)
assert code(lambda: s3.head_object(Bucket="docs", Key="missing"))[1] == 404

# Content-MD5: a body that does not match is refused and leaves the object as it was.
import base64
good = base64.b64encode(hashlib.md5(b"fresh").digest()).decode()
assert code(lambda: s3.put_object(Bucket="docs", Key="a/b/c.txt", Body=b"stale",
                                  ContentMD5=good)) == ("BadDigest", 400)
assert s3.get_object(Bucket="docs", Key="a/b/c.txt")["Body"].read() == body
s3.put_object(Bucket="docs", Key="md5", Body=b"fresh", ContentMD5=good)
assert s3.get_object(Bucket="docs", Key="md5")["Body"].read() == b"fresh"
s3.delete_object(Bucket="docs", Key="md5")
# CopyObject, keeping or replacing the metadata.
s3.copy_object(CopySource={"Bucket": "docs", "Key": "a/b/c.txt"}, Bucket="docs", Key="copied")
g = s3.get_object(Bucket="docs", Key="copied")
assert g["Body"].read() == body and g["Metadata"] == {"color": "blue", "owner": "ops"}
s3.copy_object(CopySource={"Bucket": "docs", "Key": "a/b/c.txt"}, Bucket="docs", Key="copied",
               MetadataDirective="REPLACE", ContentType="text/x", Metadata={"k": "v"})
g = s3.get_object(Bucket="docs", Key="copied")
assert g["Body"].read() == body and g["Metadata"] == {"k": "v"} and g["ContentType"] == "text/x"
assert code(lambda: s3.copy_object(CopySource={"Bucket": "docs", "Key": "nope"}, Bucket="docs",
                                   Key="copied"))[0] == "NoSuchKey"
s3.delete_object(Bucket="docs", Key="copied")

# Overwrite, then an empty object.
s3.put_object(Bucket="docs", Key="a/b/c.txt", Body=b"short")
assert s3.get_object(Bucket="docs", Key="a/b/c.txt")["Body"].read() == b"short"
s3.put_object(Bucket="docs", Key="empty", Body=b"")
assert s3.get_object(Bucket="docs", Key="empty")["Body"].read() == b""

# Listing: prefix, delimiter, pagination with continuation tokens.
keys = ["a/b/c.txt", "empty"] + ["logs/2024/%02d.log" % i for i in range(7)] + \
       ["logs/2025/01.log", "logs/readme", "z"]
for k in keys[2:]:
    s3.put_object(Bucket="docs", Key=k, Body=k.encode())
got, token, pages = [], None, 0
while True:
    kw = {"ContinuationToken": token} if token else {}
    r = s3.list_objects_v2(Bucket="docs", MaxKeys=3, **kw)
    pages += 1
    got += [o["Key"] for o in r.get("Contents", [])]
    assert r["KeyCount"] == len(r.get("Contents", []))
    if not r["IsTruncated"]:
        break
    token = r["NextContinuationToken"]
assert got == sorted(keys), got
assert pages == 4, pages
r = s3.list_objects_v2(Bucket="docs", Prefix="logs/", Delimiter="/")
assert [p["Prefix"] for p in r["CommonPrefixes"]] == ["logs/2024/", "logs/2025/"]
assert [o["Key"] for o in r["Contents"]] == ["logs/readme"]
r = s3.list_objects_v2(Bucket="docs", Delimiter="/", MaxKeys=2)
assert [p["Prefix"] for p in r.get("CommonPrefixes", [])] == ["a/"] and r["IsTruncated"]
r = s3.list_objects_v2(Bucket="docs", Delimiter="/", MaxKeys=2,
                       ContinuationToken=r["NextContinuationToken"])
assert [p["Prefix"] for p in r.get("CommonPrefixes", [])] == ["logs/"]
assert [o["Key"] for o in r["Contents"]] == ["z"] and not r["IsTruncated"]
r = s3.list_objects_v2(Bucket="docs", Prefix="logs/2024/", StartAfter="logs/2024/04.log")
assert [o["Key"] for o in r["Contents"]] == ["logs/2024/05.log", "logs/2024/06.log"]
assert s3.list_objects_v2(Bucket="docs", Prefix="nothing/").get("Contents", []) == []
# ListObjects (v1): markers, including a common prefix as the marker.
got, marker = [], ""
while True:
    r = s3.list_objects(Bucket="docs", Delimiter="/", MaxKeys=1, Marker=marker)
    got += [p["Prefix"] for p in r.get("CommonPrefixes", [])]
    got += [o["Key"] for o in r.get("Contents", [])]
    if not r["IsTruncated"]:
        break
    marker = r["NextMarker"]
assert got == ["a/", "empty", "logs/", "z"], got
r = s3.list_objects(Bucket="docs", Prefix="logs/2024/", Marker="logs/2024/05.log")
assert [o["Key"] for o in r["Contents"]] == ["logs/2024/06.log"]

# Multipart: three parts (5 MiB, 5 MiB, 1 byte), one uploaded twice; listed; completed.
part = [bytes([i]) * (5 << 20) for i in (1, 2)] + [b"!"]
up = s3.create_multipart_upload(Bucket="docs", Key="big", ContentType="video/mp4")["UploadId"]
tags = []
for n, p in enumerate(part, 1):
    tags.append(s3.upload_part(Bucket="docs", Key="big", UploadId=up, PartNumber=n,
                               Body=p)["ETag"])
tags[1] = s3.upload_part(Bucket="docs", Key="big", UploadId=up, PartNumber=2,
                         Body=part[1])["ETag"]
lp = s3.list_parts(Bucket="docs", Key="big", UploadId=up)
assert [(p["PartNumber"], p["Size"]) for p in lp["Parts"]] == [(1, 5 << 20), (2, 5 << 20), (3, 1)]
assert code(lambda: s3.complete_multipart_upload(
    Bucket="docs", Key="big", UploadId=up,
    MultipartUpload={"Parts": [{"PartNumber": 2, "ETag": tags[1]},
                               {"PartNumber": 1, "ETag": tags[0]}]}))[0] == "InvalidPartOrder"
assert code(lambda: s3.complete_multipart_upload(
    Bucket="docs", Key="big", UploadId=up,
    MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": tags[1]}]}))[0] == "InvalidPart"
r = s3.complete_multipart_upload(
    Bucket="docs", Key="big", UploadId=up,
    MultipartUpload={"Parts": [{"PartNumber": n, "ETag": t} for n, t in enumerate(tags, 1)]})
whole = b"".join(part)
md5s = b"".join(hashlib.md5(p).digest() for p in part)
assert r["ETag"] == '"%s-3"' % hashlib.md5(md5s).hexdigest(), r["ETag"]
g = s3.get_object(Bucket="docs", Key="big")
assert g["Body"].read() == whole and g["ContentType"] == "video/mp4"
g = s3.get_object(Bucket="docs", Key="big", Range="bytes=%d-%d" % ((5 << 20) - 2, (10 << 20)))
assert g["Body"].read() == whole[(5 << 20) - 2:]
assert code(lambda: s3.list_parts(Bucket="docs", Key="big", UploadId=up))[0] == "NoSuchUpload"

# A small part before the last is refused; an aborted upload is gone.
up = s3.create_multipart_upload(Bucket="docs", Key="small")["UploadId"]
t1 = s3.upload_part(Bucket="docs", Key="small", UploadId=up, PartNumber=1, Body=b"x")["ETag"]
t2 = s3.upload_part(Bucket="docs", Key="small", UploadId=up, PartNumber=2, Body=b"y")["ETag"]
assert code(lambda: s3.complete_multipart_upload(
    Bucket="docs", Key="small", UploadId=up,
    MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": t1},
                               {"PartNumber": 2, "ETag": t2}]}))[0] == "EntityTooSmall"
assert code(lambda: s3.delete_bucket(Bucket="docs"))[0] == "BucketNotEmpty"
s3.abort_multipart_upload(Bucket="docs", Key="small", UploadId=up)
assert code(lambda: s3.upload_part(Bucket="docs", Key="small", UploadId=up, PartNumber=3,
                                   Body=b"z"))[0] == "NoSuchUpload"
got = code(lambda: s3.get_object(Bucket="docs", Key="small"))
assert got[0] == "NoSuchKey", got

# A forged signature and an unknown key are refused.
assert code(lambda: client("wrong").list_objects_v2(Bucket="docs")) == \
    ("SignatureDoesNotMatch", 403)
stranger = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="NOBODY",
                        aws_secret_access_key=secret, region_name="us-east-1")
assert code(lambda: stranger.list_buckets())[1] == 403

# Delete everything, then the bucket.
for k in keys + ["big"]:
    s3.delete_object(Bucket="docs", Key=k)
s3.delete_object(Bucket="docs", Key="never-there")
assert s3.list_objects_v2(Bucket="docs")["KeyCount"] == 0
s3.delete_bucket(Bucket="docs")
assert s3.list_buckets()["Buckets"] == []
print("boto3 ok")
"#;

/// Sends `req` on a new connection and returns what came back until the gateway closed it or
/// went quiet for a second.
fn raw(addr: SocketAddr, req: &[u8]) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(1)))
        .unwrap();
    let _ = s.write_all(req);
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

/// Hostile peers: garbage, unsigned and forged requests, a body announced at 10 GB that never
/// comes, a header flood. Each gets an HTTP error (or a closed connection), and the gateway
/// keeps serving.
fn hostile_requests(addr: SocketAddr, gw: &mut Guard) {
    let garbage = raw(addr, b"\x16\x03\x01 not http at all\r\n\r\n");
    assert!(
        garbage.is_empty() || garbage.starts_with("HTTP/1.1 400"),
        "{garbage}"
    );
    let unsigned = raw(
        addr,
        b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    assert!(unsigned.starts_with("HTTP/1.1 403"), "{unsigned}");
    assert!(unsigned.contains("AccessDenied"), "{unsigned}");
    let forged = format!(
        "PUT /docs/k HTTP/1.1\r\nHost: {addr}\r\nContent-Length: 10000000000\r\n\
         x-amz-date: 20240101T000000Z\r\nx-amz-content-sha256: UNSIGNED-PAYLOAD\r\n\
         Authorization: AWS4-HMAC-SHA256 Credential={ACCESS}/20240101/us-east-1/s3/\
         aws4_request, SignedHeaders=host;x-amz-date, Signature={}\r\n\r\nsome bytes",
        "0".repeat(64)
    );
    let forged = raw(addr, forged.as_bytes());
    assert!(forged.starts_with("HTTP/1.1 403"), "{forged}");
    let mut flood = b"GET / HTTP/1.1\r\nHost: x\r\nX-Flood: ".to_vec();
    flood.resize(2 << 20, b'a');
    let flood = raw(addr, &flood);
    assert!(
        flood.is_empty() || flood.starts_with("HTTP/1.1 431"),
        "{flood}"
    );
    common::assert_alive(gw, "dds s3");
}

#[test]
fn boto3_operations_errors_and_signatures() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let c = cluster(d);
    let (mut gw, addr) = gateway(&c, &[]);
    hostile_requests(addr, &mut gw);
    let script = d.join("boto3_s3.py");
    std::fs::write(&script, BOTO3).unwrap();
    let out = Command::new("python3")
        .arg(&script)
        .arg(format!("http://{addr}"))
        .args([ACCESS, SECRET])
        .env("AWS_CONFIG_FILE", d.join("no-aws-config"))
        .env("AWS_SHARED_CREDENTIALS_FILE", d.join("no-aws-credentials"))
        .output()
        .expect("python3 with boto3 (pip install boto3)");
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "boto3 ok");
}

/// A map of one OSD that is never started (pool 1 "data"): enough for the gateway to start
/// and answer what needs no cluster.
fn unstarted_map(dir: &Path) -> std::path::PathBuf {
    let map = dir.join("cluster.toml");
    std::fs::write(
        &map,
        "epoch = 1\n[[osd]]\nid = 0\naddr = \"127.0.0.1:0\"\npeer_addr = \"127.0.0.1:0\"\n\
         [[pool]]\nid = 1\nname = \"data\"\npg_num = 1\nsize = 1\n",
    )
    .unwrap();
    map
}

#[test]
fn a_gateway_without_keys_or_pool_refuses_to_start() {
    let dir = tempfile::tempdir().unwrap();
    let map = unstarted_map(dir.path());
    let out = Command::new(DDS)
        .arg("s3")
        .arg("--map")
        .arg(&map)
        .env_remove("DDS_S3_ACCESS_KEY")
        .env_remove("DDS_S3_SECRET_KEY")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--access-key"));
    let out = Command::new(DDS)
        .arg("s3")
        .arg("--map")
        .arg(&map)
        .args([
            "--pool",
            "nope",
            "--access-key",
            ACCESS,
            "--secret-key",
            SECRET,
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no pool nope in the map"));
    // A grace too short for any write to finish between two stripes.
    let out = Command::new(DDS)
        .args(["s3", "--access-key", ACCESS, "--secret-key", SECRET])
        .args(["--orphan-grace", "1", "--map"])
        .arg(&map)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--orphan-grace"));
}

#[test]
fn s3_keeps_serving_when_the_primary_of_an_index_shard_is_killed() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut c = common::start_etcd_osds(d, 3);
    let mut cmd = Command::new(DDS);
    cmd.args(["s3", "--etcd", &c.url, "--cluster", "t", "--pool", "data"])
        .args(["--access-key", ACCESS, "--secret-key", SECRET]);
    let (_gw, addr) = common::spawn_listening(&mut cmd);
    aws(addr, d, &["s3", "mb", "s3://keep"]);
    let objects: Vec<(String, Vec<u8>)> = (0..3)
        .map(|i| {
            (
                format!("k{i}"),
                pattern(if i == 0 { 5 << 20 } else { 1000 }, i),
            )
        })
        .collect();
    for (k, data) in &objects {
        std::fs::write(d.join(k), data).unwrap();
        aws(addr, d, &["s3", "cp", k, &format!("s3://keep/{k}")]);
    }

    // Each key's index entry is in the shard its name hashes to.
    use dds_objstore::ObjectId;
    use dds_s3::record::{index_name, INDEX_SHARDS};
    for (k, _) in &objects {
        let shard = ObjectId::new(1, index_name("keep", INDEX_SHARDS, k.as_bytes()));
        let got = c.client.omap_get(&shard, &[k.as_bytes().to_vec()]).unwrap();
        assert!(got[0].is_some(), "{k} not in its index shard");
    }
    // A bucket of an earlier gateway (version 1 record, one index object) keeps working.
    let mut v1 = vec![1u8];
    v1.extend_from_slice(&7u64.to_le_bytes());
    c.client
        .omap_set(
            &ObjectId::new(1, b"s3.buckets".to_vec()),
            &[(b"old".to_vec(), v1)],
        )
        .unwrap();
    std::fs::write(d.join("x"), b"into an unsharded index").unwrap();
    aws(addr, d, &["s3", "cp", "x", "s3://old/x"]);
    let unsharded = c
        .client
        .omap_list(&ObjectId::new(1, b"s3.index.old".to_vec()), None, 10)
        .unwrap();
    assert_eq!(unsharded.len(), 1);
    assert_eq!(unsharded[0].0, b"x");
    assert!(aws(addr, d, &["s3", "ls", "s3://old"]).contains(" x\n"));
    aws(addr, d, &["s3", "cp", "s3://old/x", "x.back"]);
    assert_eq!(
        std::fs::read(d.join("x.back")).unwrap(),
        b"into an unsharded index"
    );

    // kill -9 of the primary of the index shard that holds the next key: the gateway's next
    // write and listing wait for the new primary (the cluster client retries) and succeed.
    let map = c.client.map();
    let shard = dds_s3::record::index_name("keep", dds_s3::record::INDEX_SHARDS, b"after");
    let pg = map.pg_of(1, &shard).unwrap();
    let primary = map.acting(pg)[0];
    drop(c.osds[primary as usize].take());
    std::fs::write(d.join("after"), b"written after the kill").unwrap();
    aws(addr, d, &["s3", "cp", "after", "s3://keep/after"]);
    let listed = aws(addr, d, &["s3", "ls", "s3://keep"]);
    let keys: Vec<&str> = listed
        .lines()
        .filter_map(|l| l.split_whitespace().nth(3))
        .collect();
    assert_eq!(keys, ["after", "k0", "k1", "k2"]);
    for (k, data) in &objects {
        let _ = std::fs::remove_file(d.join("out.bin"));
        aws(addr, d, &["s3", "cp", &format!("s3://keep/{k}"), "out.bin"]);
        assert!(std::fs::read(d.join("out.bin")).unwrap() == *data, "{k}");
    }
}

#[test]
fn connections_beyond_the_limit_wait_for_a_free_slot() {
    use std::io::{Read, Write};
    let dir = tempfile::tempdir().unwrap();
    let map = unstarted_map(dir.path());
    let mut cmd = Command::new(DDS);
    cmd.arg("s3")
        .arg("--map")
        .arg(&map)
        .args(["--access-key", ACCESS, "--secret-key", SECRET])
        .args(["--max-connections", "1"]);
    let (mut gw, addr) = common::spawn_listening(&mut cmd);
    // An idle connection holds the only slot; the next client is not served meanwhile.
    let idle = std::net::TcpStream::connect(addr).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(200));
    let mut next = std::net::TcpStream::connect(addr).unwrap();
    next.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .unwrap();
    next.set_read_timeout(Some(std::time::Duration::from_secs(1)))
        .unwrap();
    let mut buf = [0u8; 64];
    assert!(next.read(&mut buf).is_err(), "served beyond the limit");
    // Once it closes, the waiting client gets its answer (403: it is not signed).
    drop(idle);
    next.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    let mut out = Vec::new();
    let _ = next.read_to_end(&mut out);
    assert!(
        out.starts_with(b"HTTP/1.1 403"),
        "{}",
        String::from_utf8_lossy(&out)
    );
    common::assert_alive(&mut gw, "dds s3");
}

/// A PUT through a presigned URL of `total` bytes that sends `send` of them, prints "sent",
/// then stalls (`stall`) or closes its connection (`close`).
const PARTIAL_PUT: &str = r#"
import http.client, sys, time, urllib.parse
import boto3
from botocore.config import Config
endpoint, access, secret, bucket, key, total, send, mode = sys.argv[1:9]
s3 = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=access,
                  aws_secret_access_key=secret, region_name="us-east-1",
                  config=Config(signature_version="s3v4"))
url = urllib.parse.urlsplit(s3.generate_presigned_url(
    "put_object", Params={"Bucket": bucket, "Key": key}, ExpiresIn=600))
c = http.client.HTTPConnection(url.hostname, url.port)
c.putrequest("PUT", url.path + "?" + url.query)
c.putheader("Content-Length", total)
c.endheaders()
chunk = bytes(range(256)) * 4096
for _ in range(int(send) // len(chunk)):
    c.send(chunk)
print("sent", flush=True)
if mode == "stall":
    time.sleep(600)
c.sock.close()
"#;

/// Starts [`PARTIAL_PUT`] and waits for its "sent".
fn partial_put(
    addr: SocketAddr,
    dir: &Path,
    key: &str,
    total: usize,
    send: usize,
    mode: &str,
) -> Guard {
    use std::io::BufRead;
    let script = dir.join("partial_put.py");
    std::fs::write(&script, PARTIAL_PUT).unwrap();
    let mut child = Command::new("python3")
        .arg(&script)
        .arg(format!("http://{addr}"))
        .args([ACCESS, SECRET, "orphans", key])
        .args([total.to_string(), send.to_string(), mode.to_string()])
        .env("AWS_CONFIG_FILE", dir.join("no-aws-config"))
        .env(
            "AWS_SHARED_CREDENTIALS_FILE",
            dir.join("no-aws-credentials"),
        )
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("python3 with boto3");
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "sent");
    Guard(child)
}

/// `s3api put-object` of the file `file` as `key` of bucket `orphans`.
fn put_file(addr: SocketAddr, dir: &Path, key: &str, file: &str) {
    let args = ["s3api", "put-object", "--bucket", "orphans", "--key"];
    aws(addr, dir, &[&args[..], &[key, "--body", file]].concat());
}

/// `s3api get-object` of `key` of bucket `orphans`: its bytes.
fn get_file(addr: SocketAddr, dir: &Path, key: &str) -> Vec<u8> {
    let _ = std::fs::remove_file(dir.join("out.bin"));
    let args = ["s3api", "get-object", "--bucket", "orphans", "--key"];
    aws(addr, dir, &[&args[..], &[key, "out.bin"]].concat());
    std::fs::read(dir.join("out.bin")).unwrap()
}

/// The stripe objects of the pool, as `dds objects ls` lists them.
fn stripe_objects(c: &OsdCluster) -> std::collections::BTreeSet<String> {
    let mut ls = Command::new(DDS);
    ls.args(["objects", "--pool", "data", "--map"])
        .arg(&c.map)
        .arg("ls");
    String::from_utf8(common::stdout_of(&mut ls))
        .unwrap()
        .lines()
        .filter(|n| n.starts_with("s3.data."))
        .map(String::from)
        .collect()
}

/// The stripes of `now` that are not in `before`, by instance (the 16 hex digits).
fn new_instances(
    before: &std::collections::BTreeSet<String>,
    now: &std::collections::BTreeSet<String>,
) -> std::collections::BTreeMap<String, usize> {
    let mut out = std::collections::BTreeMap::new();
    for n in now.difference(before) {
        *out.entry(n["s3.data.".len()..][..16].to_string())
            .or_insert(0) += 1;
    }
    out
}

/// Polls until `done` holds of the pool's stripes (60 s at most).
fn wait_stripes(
    c: &OsdCluster,
    what: &str,
    done: impl Fn(&std::collections::BTreeSet<String>) -> bool,
) -> std::collections::BTreeSet<String> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let now = stripe_objects(c);
        if done(&now) {
            return now;
        }
        assert!(std::time::Instant::now() < deadline, "{what}: {now:?}");
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}

/// The orphan sweep (docs/s3.md, "Orphaned stripes") with a grace of 10 s (a write may stall
/// 5 s between stripes) and a sweep every second: the stripes of a PUT whose gateway was
/// killed, and leftovers of replaced objects and parts, are removed once old enough; every
/// stripe of an acknowledged object or of an upload in progress stays.
#[test]
fn orphaned_stripes_of_a_killed_put_and_of_replaced_objects_are_swept() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let c = cluster(d);
    let sweep = ["--orphan-grace", "10", "--sweep-interval", "1"];
    let (mut gw, addr) = gateway(&c, &sweep);
    aws(addr, d, &["s3", "mb", "s3://orphans"]);

    // Acknowledged objects: three stripes, one byte, and a multipart upload in progress with
    // one part of two stripes (its parts are referenced by the upload, not by an object).
    let three = pattern(9 << 20, 11);
    let tiny = pattern(1, 12);
    std::fs::write(d.join("three.bin"), &three).unwrap();
    std::fs::write(d.join("tiny.bin"), &tiny).unwrap();
    put_file(addr, d, "three", "three.bin");
    put_file(addr, d, "tiny", "tiny.bin");
    let part = pattern(5 << 20, 13);
    std::fs::write(d.join("part.bin"), &part).unwrap();
    let up: serde_json::Value = serde_json::from_str(&aws(
        addr,
        d,
        &[
            "s3api",
            "create-multipart-upload",
            "--bucket",
            "orphans",
            "--key",
            "multi",
        ],
    ))
    .unwrap();
    let upload = up["UploadId"].as_str().unwrap().to_string();
    let upload_part = |body: &str| {
        let args = [
            "s3api",
            "upload-part",
            "--bucket",
            "orphans",
            "--key",
            "multi",
        ];
        let out = aws(
            addr,
            d,
            &[
                &args[..],
                &[
                    "--upload-id",
                    upload.as_str(),
                    "--part-number",
                    "1",
                    "--body",
                    body,
                ],
            ]
            .concat(),
        );
        serde_json::from_str::<serde_json::Value>(&out).unwrap()["ETag"]
            .as_str()
            .unwrap()
            .to_string()
    };
    // The part first of three stripes, then again of two: the gateway removes the third.
    upload_part("three.bin");
    let before_part = stripe_objects(&c);
    let tag = upload_part("part.bin");
    let acked = stripe_objects(&c);
    assert_eq!(
        before_part.len(),
        acked.len() + 1,
        "the part's third stripe is removed"
    );
    assert_eq!(acked.len(), 3 + 1 + 2);

    // An overwrite with fewer stripes: the old instance's three go, the new one's one stays.
    let shrink = pattern(9 << 20, 14);
    std::fs::write(d.join("shrink.bin"), &shrink).unwrap();
    put_file(addr, d, "shrink", "shrink.bin");
    let with_shrink = stripe_objects(&c);
    let old = new_instances(&acked, &with_shrink);
    assert_eq!(old.values().copied().collect::<Vec<_>>(), [3]);
    put_file(addr, d, "shrink", "tiny.bin");
    let acked = stripe_objects(&c);
    let new = new_instances(&with_shrink, &acked);
    assert_eq!(new.values().copied().collect::<Vec<_>>(), [1]);
    assert!(acked
        .iter()
        .all(|n| !n.contains(old.keys().next().unwrap())));

    // A client that goes away half way: the gateway removes the stripes it wrote, before the
    // sweep's grace lets a sweep do it.
    drop(partial_put(addr, d, "gone", 40 << 20, 12 << 20, "close"));
    let closed = std::time::Instant::now();
    while stripe_objects(&c) == acked && closed.elapsed().as_secs() < 2 {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    wait_stripes(&c, "the stripes of a PUT whose client left", |now| {
        *now == acked
    });
    assert!(
        closed.elapsed().as_secs() < 10,
        "removed by the gateway, not a sweep"
    );

    // kill -9 of the gateway while a 64 MiB PUT is half way.
    let stalled = partial_put(addr, d, "killed", 64 << 20, 16 << 20, "stall");
    let killed = wait_stripes(&c, "the stripes of the stalled PUT", |now| {
        new_instances(&acked, now).values().any(|&n| n >= 3)
    });
    gw.0.kill().unwrap();
    gw.0.wait().unwrap();
    drop(stalled);
    // What a gateway dying between a record and the removals it owes leaves: stripes beyond
    // the part's and the new object's sizes, and a whole replaced instance.
    let client = dds_osd::client::Client::connect_map(&c.map).unwrap();
    let instance = new.keys().next().unwrap();
    let planted = [
        format!("s3.data.{instance}.0.1"),
        format!("s3.data.{instance}.0.2"),
        format!("s3.data.{upload}.1.2"),
        "s3.data.00000000000000aa.0.0".to_string(),
    ];
    for name in &planted {
        let oid = dds_objstore::ObjectId::new(1, name.as_bytes().to_vec());
        client.write_full(&oid, b"left behind").unwrap();
    }

    let orphans = new_instances(&acked, &stripe_objects(&c));
    assert!(
        orphans.values().sum::<usize>() >= 3 + planted.len(),
        "{orphans:?}"
    );
    assert!(killed.is_subset(&stripe_objects(&c)));

    // The restarted gateway sweeps them once they are older than the grace; every stripe of
    // an acknowledged object or part stays.
    let (_gw, addr) = gateway(&c, &sweep);
    let swept = wait_stripes(&c, "the orphans swept", |now| *now == acked);
    assert_eq!(swept, acked);
    for (key, want) in [("three", &three), ("tiny", &tiny), ("shrink", &tiny)] {
        assert!(get_file(addr, d, key) == *want, "{key}");
    }
    let parts = format!(r#"{{"Parts":[{{"PartNumber":1,"ETag":{tag:?}}}]}}"#);
    aws(
        addr,
        d,
        &[
            "s3api",
            "complete-multipart-upload",
            "--bucket",
            "orphans",
            "--key",
            "multi",
            "--upload-id",
            &upload,
            "--multipart-upload",
            &parts,
        ],
    );
    assert!(get_file(addr, d, "multi") == part, "multi");
    for key in ["killed", "gone"] {
        let out = aws_with(
            addr,
            SECRET,
            d,
            &["s3api", "head-object", "--bucket", "orphans", "--key", key],
        );
        assert!(!out.status.success(), "{key} was never acknowledged");
    }
}
