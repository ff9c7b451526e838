//! Arbitrary bytes through the frame decoder, as a stream: decode a header, step over it
//! and its payload, repeat until the decoder asks for more bytes or reports an error.
//! Every frame that decodes must re-encode to exactly the bytes it came from (one
//! encoding per frame) and decode again to itself; every prefix of it must ask for more bytes.

#![no_main]

use backend_sim_proto::wire::{Frame, BASE_LEN, MAX_DATAGRAM, MAX_HDR_LEN, MAX_MSG};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut buf = data;
    loop {
        let (frame, n) = match Frame::decode(buf) {
            Ok(Some(x)) => x,
            // Need more bytes: only a short buffer may ask for more.
            Ok(None) => {
                assert!(buf.len() < MAX_HDR_LEN, "{} bytes and still short", buf.len());
                break;
            }
            Err(_) => break,
        };
        assert!((BASE_LEN..=MAX_HDR_LEN).contains(&n), "header length {n}");
        assert!(n <= buf.len());
        assert!(frame.payload_len() <= MAX_MSG);
        if let Frame::Datagram { len, .. } = frame {
            assert!(len <= MAX_DATAGRAM, "a datagram above the MTU decoded: {len}");
        }
        assert!(
            !(frame.is_request() && frame.is_response()),
            "{frame} is both a request and a response"
        );

        // Round trip: the canonical encoding is the input itself.
        let mut out = [0u8; MAX_HDR_LEN];
        let m = frame.encode(&mut out);
        assert_eq!(&out[..m], &buf[..n], "{frame} re-encodes differently");
        assert_eq!(Frame::decode(&out[..m]), Ok(Some((frame, m))));
        // Trailing bytes do not change what a complete header decodes to.
        let mut longer = [0xa5u8; MAX_HDR_LEN + 8];
        longer[..m].copy_from_slice(&out[..m]);
        assert_eq!(Frame::decode(&longer), Ok(Some((frame, m))));
        // A strict prefix of a header never decodes to a frame.
        for k in 0..m {
            assert_eq!(Frame::decode(&out[..k]), Ok(None), "{k}-byte prefix of {frame}");
        }

        // Step over the header and its payload, as the stream reader does.
        let skip = n as u64 + frame.payload_len() as u64;
        if skip > buf.len() as u64 {
            break;
        }
        buf = &buf[skip as usize..];
    }
});
