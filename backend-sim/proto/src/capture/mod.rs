//! The sim's traffic as the RoCE v2 packets an HCA would put on an Ethernet wire, and
//! the pcapng blocks that hold them, for a capture that Wireshark and tshark read
//! (their `infiniband` dissector takes UDP port 4791). Pure encoding, as the rest of
//! this crate: the driver decides what to capture and writes the bytes.
//!
//! - [`opcode`]: IBA's transport opcodes and the extended headers each carries.
//! - [`headers`]: the BTH and extended headers of one packet.
//! - [`icrc`]: the invariant CRC as rxe computes it.
//! - [`packet`]: a whole packet (Ethernet, IP, UDP, headers, payload, ICRC), with the
//!   fields an HCA derives (UDP source port, MACs) derived as rxe does.
//! - [`segment`]: a message as its packets of one path MTU each.
//! - [`pcapng`]: the file's blocks.
//! - [`read`] and [`parse`]: the way back, from a capture file (the sim's, or
//!   `tcpdump`'s of a real RoCE port) to packets and their headers.

pub mod headers;
pub mod icrc;
pub mod opcode;
pub mod packet;
pub mod parse;
pub mod pcapng;
pub mod read;
pub mod segment;
