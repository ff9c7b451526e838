//! The kv-rpc wire format: one request or response per SEND, little-endian, with a fixed
//! maximum size so that the server's pre-posted receive buffers always fit a request.
//!
//! ```text
//! request:  op u8 (1 GET, 2 PUT, 3 DELETE) | key_len u8 | value_len u16 | req_id u32 | key | value
//! response: status u8 (0 OK, 1 NOT_FOUND, 2 BAD_REQUEST) | op u8 | value_len u16 | req_id u32 | value
//! ```
//!
//! Keys are 1..=[`MAX_KEY`] bytes, values 0..=[`MAX_VALUE`] (GET and DELETE carry none;
//! a GET response carries the value).

/// Longest key.
pub const MAX_KEY: usize = 64;
/// Longest value.
pub const MAX_VALUE: usize = 1024;
/// Header bytes of both messages.
pub const HEADER: usize = 8;
/// The fixed maximum request size: the size of every server receive buffer.
pub const MAX_REQ: usize = HEADER + MAX_KEY + MAX_VALUE;
/// The fixed maximum response size: the size of every client receive buffer.
pub const MAX_RESP: usize = HEADER + MAX_VALUE;

/// A request operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Op {
    /// Read a key.
    Get = 1,
    /// Write a key.
    Put = 2,
    /// Remove a key.
    Delete = 3,
}

impl Op {
    fn from_u8(v: u8) -> Option<Op> {
        match v {
            1 => Some(Op::Get),
            2 => Some(Op::Put),
            3 => Some(Op::Delete),
            _ => None,
        }
    }
}

/// A response status.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Status {
    /// Done (GET: the value follows).
    Ok = 0,
    /// GET or DELETE of a key that does not exist.
    NotFound = 1,
    /// The request could not be parsed.
    BadRequest = 2,
}

/// A decoded request, borrowing the receive buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request<'a> {
    /// Operation.
    pub op: Op,
    /// Echoed in the response.
    pub req_id: u32,
    /// Key.
    pub key: &'a [u8],
    /// Value (PUT only).
    pub value: &'a [u8],
}

/// A decoded response, borrowing the receive buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Response<'a> {
    /// Outcome.
    pub status: Status,
    /// The request's operation.
    pub op: u8,
    /// The request's id.
    pub req_id: u32,
    /// Value (GET with `Ok`).
    pub value: &'a [u8],
}

/// Encodes a request into `buf` (at least [`MAX_REQ`] bytes) and returns its length.
pub fn encode_request(
    buf: &mut [u8],
    op: Op,
    req_id: u32,
    key: &[u8],
    value: &[u8],
) -> Result<usize, String> {
    if key.is_empty() || key.len() > MAX_KEY {
        return Err(format!("key of {} bytes (1..={MAX_KEY})", key.len()));
    }
    if value.len() > MAX_VALUE {
        return Err(format!("value of {} bytes (at most {MAX_VALUE})", value.len()));
    }
    let n = HEADER + key.len() + value.len();
    if buf.len() < n {
        return Err(format!("buffer of {} bytes for a {n}-byte request", buf.len()));
    }
    buf[0] = op as u8;
    buf[1] = key.len() as u8;
    buf[2..4].copy_from_slice(&(value.len() as u16).to_le_bytes());
    buf[4..8].copy_from_slice(&req_id.to_le_bytes());
    buf[HEADER..HEADER + key.len()].copy_from_slice(key);
    buf[HEADER + key.len()..n].copy_from_slice(value);
    Ok(n)
}

/// Decodes a request of `buf.len()` bytes (the receive completion's `byte_len`).
pub fn decode_request(buf: &[u8]) -> Result<Request<'_>, String> {
    if buf.len() < HEADER {
        return Err(format!("{}-byte request is shorter than the header", buf.len()));
    }
    let op = Op::from_u8(buf[0]).ok_or_else(|| format!("unknown op {}", buf[0]))?;
    let klen = buf[1] as usize;
    let vlen = u16::from_le_bytes([buf[2], buf[3]]) as usize;
    let req_id = u32::from_le_bytes([buf[4], buf[5], buf[6], buf[7]]);
    if klen == 0 || klen > MAX_KEY || vlen > MAX_VALUE {
        return Err(format!("key_len {klen} / value_len {vlen} out of range"));
    }
    if buf.len() != HEADER + klen + vlen {
        return Err(format!(
            "request of {} bytes, header says {}",
            buf.len(),
            HEADER + klen + vlen
        ));
    }
    Ok(Request {
        op,
        req_id,
        key: &buf[HEADER..HEADER + klen],
        value: &buf[HEADER + klen..],
    })
}

/// Encodes a response into `buf` (at least [`MAX_RESP`] bytes) and returns its length.
pub fn encode_response(buf: &mut [u8], status: Status, op: u8, req_id: u32, value: &[u8]) -> usize {
    let v = &value[..value.len().min(MAX_VALUE)];
    buf[0] = status as u8;
    buf[1] = op;
    buf[2..4].copy_from_slice(&(v.len() as u16).to_le_bytes());
    buf[4..8].copy_from_slice(&req_id.to_le_bytes());
    buf[HEADER..HEADER + v.len()].copy_from_slice(v);
    HEADER + v.len()
}

/// Decodes a response of `buf.len()` bytes.
pub fn decode_response(buf: &[u8]) -> Result<Response<'_>, String> {
    if buf.len() < HEADER {
        return Err(format!("{}-byte response is shorter than the header", buf.len()));
    }
    let status = match buf[0] {
        0 => Status::Ok,
        1 => Status::NotFound,
        2 => Status::BadRequest,
        s => return Err(format!("unknown status {s}")),
    };
    let vlen = u16::from_le_bytes([buf[2], buf[3]]) as usize;
    if buf.len() != HEADER + vlen {
        return Err(format!(
            "response of {} bytes, header says {}",
            buf.len(),
            HEADER + vlen
        ));
    }
    Ok(Response {
        status,
        op: buf[1],
        req_id: u32::from_le_bytes([buf[4], buf[5], buf[6], buf[7]]),
        value: &buf[HEADER..],
    })
}

/// The value the demo client PUTs for `key` (deterministic, so a GET can be checked
/// without remembering it): `len` bytes derived from the key.
pub fn value_for(key: &[u8], len: usize) -> Vec<u8> {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in key {
        h = (h ^ b as u64).wrapping_mul(0x100_0000_01b3);
    }
    (0..len)
        .map(|i| {
            h ^= h << 13;
            h ^= h >> 7;
            h ^= h << 17;
            (h as u8) ^ (i as u8)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_roundtrip() {
        let mut b = [0u8; MAX_REQ];
        let n = encode_request(&mut b, Op::Put, 7, b"k1", b"value").unwrap();
        let r = decode_request(&b[..n]).unwrap();
        assert_eq!(r.op, Op::Put);
        assert_eq!(r.req_id, 7);
        assert_eq!(r.key, b"k1");
        assert_eq!(r.value, b"value");
        let big = vec![1u8; MAX_VALUE];
        let n = encode_request(&mut b, Op::Put, 1, &[9u8; MAX_KEY], &big).unwrap();
        assert_eq!(n, MAX_REQ);
        assert!(encode_request(&mut b, Op::Put, 1, b"", b"").is_err());
        assert!(encode_request(&mut b, Op::Put, 1, &[0; MAX_KEY + 1], b"").is_err());
    }

    #[test]
    fn response_roundtrip() {
        let mut b = [0u8; MAX_RESP];
        let n = encode_response(&mut b, Status::Ok, Op::Get as u8, 99, b"abc");
        let r = decode_response(&b[..n]).unwrap();
        assert_eq!((r.status, r.req_id, r.value), (Status::Ok, 99, &b"abc"[..]));
    }

    #[test]
    fn garbage_is_refused() {
        assert!(decode_request(&[]).is_err());
        assert!(decode_request(&[9, 1, 0, 0, 0, 0, 0, 0, b'k']).is_err());
        assert!(decode_request(&[1, 1, 0, 0, 0, 0, 0, 0]).is_err()); // short
        assert!(decode_response(&[0, 0, 5, 0, 0, 0, 0, 0]).is_err());
        for len in 0..40 {
            let junk: Vec<u8> = (0..len as u8).map(|i| i.wrapping_mul(37)).collect();
            let _ = decode_request(&junk);
            let _ = decode_response(&junk);
        }
    }

    #[test]
    fn values_are_deterministic() {
        assert_eq!(value_for(b"a", 16), value_for(b"a", 16));
        assert_ne!(value_for(b"a", 16), value_for(b"b", 16));
    }
}
