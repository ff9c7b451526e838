//! What a kv-rpc client connection asks and what it must get back: PUT every key, GET
//! every key, DELETE the even ones, GET every key again ([`Workload`]); each answer is
//! checked against what its request must get ([`Expect`]) and counted in the
//! connection's [`ClientReport`].

use super::report::ClientReport;
use super::wire::{self, Op, Response, Status};
use crate::Res;

/// What a request must get back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expect {
    /// A PUT: OK.
    PutOk = 0,
    /// A GET of a stored key: OK with the value PUT.
    Value = 1,
    /// A DELETE: OK.
    DeleteOk = 2,
    /// A GET of a deleted key: NOT_FOUND.
    Gone = 3,
}

/// How each [`Expect`] is named in the reports.
pub const CHECK_LABELS: [&str; 4] = [
    "PUT ok",
    "GET returned the PUT value",
    "DELETE ok",
    "GET of a deleted key: not found",
];

/// One connection's requests, in order (request `i` has `req_id` `i`).
#[derive(Clone, Debug)]
pub struct Workload {
    keys: Vec<Vec<u8>>,
    ops: Vec<(Op, usize, Expect)>,
    value_size: usize,
}

impl Workload {
    /// The requests of connection `id` over `keys` keys (named `c<id>-k<i>`), PUTting
    /// values of `value_size` bytes.
    pub fn new(id: u32, keys: u32, value_size: usize) -> Workload {
        let keys: Vec<Vec<u8>> = (0..keys).map(|i| format!("c{id}-k{i}").into_bytes()).collect();
        let n = keys.len();
        let mut ops: Vec<(Op, usize, Expect)> = Vec::new();
        ops.extend((0..n).map(|k| (Op::Put, k, Expect::PutOk)));
        ops.extend((0..n).map(|k| (Op::Get, k, Expect::Value)));
        ops.extend((0..n).step_by(2).map(|k| (Op::Delete, k, Expect::DeleteOk)));
        ops.extend((0..n).map(|k| (Op::Get, k, if k % 2 == 0 { Expect::Gone } else { Expect::Value })));
        Workload {
            keys,
            ops,
            value_size,
        }
    }

    /// How many requests.
    pub fn len(&self) -> usize {
        self.ops.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// The operation of request `i`.
    pub fn op(&self, i: usize) -> Op {
        self.ops[i].0
    }

    /// Encodes request `i` into `buf` (at least [`MAX_REQ`](wire::MAX_REQ) bytes);
    /// returns its length.
    pub fn encode(&self, i: usize, buf: &mut [u8]) -> Res<usize> {
        let (op, k, _) = self.ops[i];
        let key = &self.keys[k];
        let value = if op == Op::Put {
            wire::value_for(key, self.value_size)
        } else {
            Vec::new()
        };
        wire::encode_request(buf, op, i as u32, key, &value).map_err(anyhow::Error::msg)
    }

    /// Checks the answer `r` to request `i` and counts it in `rep`: a match by its
    /// [`Expect`], a mismatch with (for the first three) what was wrong.
    pub fn check(&self, i: usize, r: &Response<'_>, rep: &mut ClientReport) {
        let (op, k, expect) = self.ops[i];
        let key = &self.keys[k];
        let ok = match expect {
            Expect::PutOk | Expect::DeleteOk => r.status == Status::Ok,
            Expect::Gone => r.status == Status::NotFound,
            Expect::Value => {
                r.status == Status::Ok && r.value == wire::value_for(key, self.value_size).as_slice()
            }
        };
        if ok {
            rep.checked[expect as usize] += 1;
            return;
        }
        rep.mismatches += 1;
        if rep.examples.len() < 3 {
            rep.examples.push(format!(
                "{op:?} {}: expected {}, got {:?} with {} value bytes",
                String::from_utf8_lossy(key),
                CHECK_LABELS[expect as usize],
                r.status,
                r.value.len()
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn put_get_delete_get() {
        let w = Workload::new(3, 4, 8);
        let ops: Vec<Op> = (0..w.len()).map(|i| w.op(i)).collect();
        assert_eq!(ops.len(), 4 + 4 + 2 + 4);
        assert!(ops[..4].iter().all(|&o| o == Op::Put) && ops[10..].iter().all(|&o| o == Op::Get));
        let mut buf = [0u8; wire::MAX_REQ];
        let n = w.encode(0, &mut buf).unwrap();
        let req = wire::decode_request(&buf[..n]).unwrap();
        assert_eq!((req.key, req.value.len()), (&b"c3-k0"[..], 8));
        let mut rep = ClientReport::default();
        let gone = Response {
            status: Status::NotFound,
            op: Op::Get as u8,
            req_id: 10,
            value: &[],
        };
        w.check(10, &gone, &mut rep); // key 0 was deleted
        w.check(11, &gone, &mut rep); // key 1 was not
        assert_eq!((rep.checked[Expect::Gone as usize], rep.mismatches), (1, 1));
        assert_eq!(
            rep.examples,
            ["Get c3-k1: expected GET returned the PUT value, got NotFound with 0 value bytes"]
        );
    }
}
