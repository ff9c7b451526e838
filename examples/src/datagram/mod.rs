//! ud-echo's parts besides the verbs calls (those are in `src/bin/ud-echo/`): the
//! datagram format with its sequence number and checksum ([`wire`]), a client's
//! datagrams in flight with their loss timeout ([`tracker`]), what both sides count and
//! print ([`report`]) and their command-line options ([`opts`]).

pub mod opts;
pub mod report;
pub mod tracker;
pub mod wire;
