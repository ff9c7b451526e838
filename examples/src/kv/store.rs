//! The store the kv-rpc server serves: each request executed against a map, its answer
//! encoded, and a count of what was served.

use std::collections::HashMap;

use super::wire::{self, Op, Status};

/// Requests served, by kind.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Served {
    /// GETs.
    pub get: u64,
    /// PUTs.
    pub put: u64,
    /// DELETEs.
    pub delete: u64,
    /// Requests that did not decode.
    pub bad: u64,
}

impl Served {
    /// All of them.
    pub fn total(&self) -> u64 {
        self.get + self.put + self.delete + self.bad
    }
}

/// The key-value map and what it served.
#[derive(Debug, Default)]
pub struct Store {
    map: HashMap<Vec<u8>, Vec<u8>>,
    /// Requests served so far.
    pub served: Served,
}

impl Store {
    /// Runs one request (the bytes a receive got) and encodes the answer into `resp` (at
    /// least [`MAX_RESP`](wire::MAX_RESP) bytes); returns the answer's length. A request
    /// that does not decode gets `BAD_REQUEST`.
    pub fn execute(&mut self, req: &[u8], resp: &mut [u8]) -> usize {
        let Ok(r) = wire::decode_request(req) else {
            self.served.bad += 1;
            return wire::encode_response(resp, Status::BadRequest, 0, 0, &[]);
        };
        let (status, value) = match r.op {
            Op::Get => {
                self.served.get += 1;
                match self.map.get(r.key) {
                    Some(v) => (Status::Ok, v.as_slice()),
                    None => (Status::NotFound, &[][..]),
                }
            }
            Op::Put => {
                self.served.put += 1;
                self.map.insert(r.key.to_vec(), r.value.to_vec());
                (Status::Ok, &[][..])
            }
            Op::Delete => {
                self.served.delete += 1;
                match self.map.remove(r.key) {
                    Some(_) => (Status::Ok, &[][..]),
                    None => (Status::NotFound, &[][..]),
                }
            }
        };
        wire::encode_response(resp, status, r.op as u8, r.req_id, value)
    }

    /// Keys stored.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether no key is stored.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::{decode_response, encode_request, MAX_REQ, MAX_RESP};

    fn ask(store: &mut Store, op: Op, key: &[u8], value: &[u8]) -> (Status, Vec<u8>) {
        let (mut req, mut resp) = ([0u8; MAX_REQ], [0u8; MAX_RESP]);
        let n = encode_request(&mut req, op, 5, key, value).unwrap();
        let m = store.execute(&req[..n], &mut resp);
        let r = decode_response(&resp[..m]).unwrap();
        assert_eq!((r.op, r.req_id), (op as u8, 5));
        (r.status, r.value.to_vec())
    }

    #[test]
    fn get_put_delete() {
        let mut s = Store::default();
        assert_eq!(ask(&mut s, Op::Get, b"k", b""), (Status::NotFound, vec![]));
        assert_eq!(ask(&mut s, Op::Put, b"k", b"v1"), (Status::Ok, vec![]));
        assert_eq!(ask(&mut s, Op::Get, b"k", b""), (Status::Ok, b"v1".to_vec()));
        assert_eq!(s.len(), 1);
        assert_eq!(ask(&mut s, Op::Delete, b"k", b""), (Status::Ok, vec![]));
        assert_eq!(ask(&mut s, Op::Delete, b"k", b""), (Status::NotFound, vec![]));
        let mut resp = [0u8; MAX_RESP];
        let m = s.execute(b"junk", &mut resp);
        assert_eq!(decode_response(&resp[..m]).unwrap().status, Status::BadRequest);
        let served = s.served;
        assert_eq!((served.get, served.put, served.delete, served.bad), (2, 1, 2, 1));
        assert_eq!(served.total(), 6);
    }
}
