//! The transaction encoding: round trips, and decoding of arbitrary or damaged input.

use dds_objstore::{ObjectId, Transaction, TxOp, MAX_NAME_LEN};
use proptest::prelude::*;

fn bytes(max: usize) -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(any::<u8>(), 0..max)
}

fn oid() -> impl Strategy<Value = ObjectId> {
    (any::<u64>(), bytes(40)).prop_map(|(pool, name)| ObjectId { pool, name })
}

fn op() -> impl Strategy<Value = TxOp> {
    prop_oneof![
        oid().prop_map(|oid| TxOp::Touch { oid }),
        (oid(), bytes(300)).prop_map(|(oid, data)| TxOp::WriteFull { oid, data }),
        (oid(), any::<u64>(), bytes(300)).prop_map(|(oid, offset, data)| TxOp::Write {
            oid,
            offset,
            data
        }),
        (oid(), any::<u64>()).prop_map(|(oid, size)| TxOp::Truncate { oid, size }),
        oid().prop_map(|oid| TxOp::Remove { oid }),
        (oid(), bytes(20), bytes(50)).prop_map(|(oid, name, value)| TxOp::SetXattr {
            oid,
            name,
            value
        }),
        (oid(), bytes(20)).prop_map(|(oid, name)| TxOp::RmXattr { oid, name }),
        (oid(), prop::collection::vec((bytes(20), bytes(30)), 0..5))
            .prop_map(|(oid, entries)| TxOp::OmapSet { oid, entries }),
        (oid(), prop::collection::vec(bytes(20), 0..5))
            .prop_map(|(oid, keys)| TxOp::OmapRm { oid, keys }),
        oid().prop_map(|oid| TxOp::OmapClear { oid }),
    ]
}

fn transaction() -> impl Strategy<Value = Transaction> {
    prop::collection::vec(op(), 0..8).prop_map(|ops| Transaction { ops })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn round_trip(t in transaction()) {
        let mut buf = vec![0xAA]; // encode appends
        t.encode(&mut buf);
        prop_assert_eq!(buf.len() - 1, t.encoded_len());
        let ops = Transaction::decode_ops(&buf[1..]).unwrap();
        prop_assert_eq!(ops.len(), t.ops.len());
        for (r, o) in ops.iter().zip(&t.ops) {
            prop_assert_eq!(r, &o.view());
        }
        prop_assert_eq!(Transaction::decode(&buf[1..]), Ok(t));
    }

    #[test]
    fn truncated_input_is_an_error(t in transaction(), cut in any::<prop::sample::Index>()) {
        let buf = t.to_bytes();
        let cut = cut.index(buf.len());
        prop_assert!(Transaction::decode(&buf[..cut]).is_err());
        let mut longer = buf.clone();
        longer.push(0);
        prop_assert!(Transaction::decode(&longer).is_err());
    }

    #[test]
    fn damaged_input_never_panics(t in transaction(), at in any::<prop::sample::Index>(), x in 1..=255u8) {
        let mut buf = t.to_bytes();
        let i = at.index(buf.len());
        buf[i] ^= x;
        if let Ok(d) = Transaction::decode(&buf) {
            // Whatever decodes re-encodes to the same bytes.
            prop_assert_eq!(d.to_bytes(), buf);
        }
    }

    #[test]
    fn arbitrary_input_never_panics(mut buf in bytes(200), header in any::<bool>(), count in any::<u32>()) {
        if header {
            let mut h = b"DDTX\x01\x00\x00\x00".to_vec();
            h.extend_from_slice(&count.to_le_bytes());
            h.extend_from_slice(&buf);
            buf = h;
        }
        let _ = Transaction::decode(&buf);
    }
}

#[test]
fn huge_announced_lengths_are_rejected_without_allocating() {
    let mut buf = b"DDTX\x01\x00\x00\x00".to_vec();
    buf.extend_from_slice(&u32::MAX.to_le_bytes());
    assert!(Transaction::decode(&buf).is_err());
    // One WriteFull announcing 4 GiB of data in a few bytes.
    let mut buf = b"DDTX\x01\x00\x00\x00\x01\x00\x00\x00\x02".to_vec();
    buf.extend_from_slice(&7u64.to_le_bytes());
    buf.extend_from_slice(&1u32.to_le_bytes());
    buf.push(b'a');
    buf.extend_from_slice(&u32::MAX.to_le_bytes());
    assert!(matches!(
        Transaction::decode(&buf),
        Err(dds_objstore::DecodeError::Truncated { .. })
    ));
    // An OmapRm announcing 2^32-1 keys.
    let mut buf = b"DDTX\x01\x00\x00\x00\x01\x00\x00\x00\x09".to_vec();
    buf.extend_from_slice(&7u64.to_le_bytes());
    buf.extend_from_slice(&1u32.to_le_bytes());
    buf.push(b'a');
    buf.extend_from_slice(&u32::MAX.to_le_bytes());
    assert!(Transaction::decode(&buf).is_err());
}

#[test]
fn documented_example_and_limits() {
    let t = Transaction {
        ops: vec![TxOp::Touch {
            oid: ObjectId::new(1, "a"),
        }],
    };
    let want = [
        0x44, 0x44, 0x54, 0x58, 1, 0, 0, 0, 1, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0x61,
    ];
    assert_eq!(t.to_bytes(), want);
    let long = Transaction {
        ops: vec![TxOp::Touch {
            oid: ObjectId::new(1, vec![b'x'; MAX_NAME_LEN + 1]),
        }],
    };
    assert!(matches!(
        Transaction::decode(&long.to_bytes()),
        Err(dds_objstore::DecodeError::NameTooLong { .. })
    ));
    let mut bad_version = t.to_bytes();
    bad_version[4] = 2;
    assert!(Transaction::decode(&bad_version).is_err());
}
