//! The kernel's rdma_cm interface (`<rdma/rdma_user_cm.h>`, ABI version 4): the commands
//! librdmacm writes to `/dev/infiniband/rdma_cm` and their answers, under their C names.
//! Every command is a header ([`rdma_ucm_cmd_hdr`]) followed by `in` bytes of its
//! structure; an answer is written where the structure's `response` points.

/// `RDMA_USER_CM_ABI_VERSION`.
pub const RDMA_USER_CM_ABI_VERSION: u32 = 4;
/// `RDMA_MAX_PRIVATE_DATA`.
pub const RDMA_MAX_PRIVATE_DATA: usize = 256;

/// The commands (`RDMA_USER_CM_CMD_*`).
pub mod cmd {
    pub const CREATE_ID: u32 = 0;
    pub const DESTROY_ID: u32 = 1;
    pub const BIND_IP: u32 = 2;
    pub const RESOLVE_IP: u32 = 3;
    pub const RESOLVE_ROUTE: u32 = 4;
    pub const QUERY_ROUTE: u32 = 5;
    pub const CONNECT: u32 = 6;
    pub const LISTEN: u32 = 7;
    pub const ACCEPT: u32 = 8;
    pub const REJECT: u32 = 9;
    pub const DISCONNECT: u32 = 10;
    pub const INIT_QP_ATTR: u32 = 11;
    pub const GET_EVENT: u32 = 12;
    pub const GET_OPTION: u32 = 13;
    pub const SET_OPTION: u32 = 14;
    pub const NOTIFY: u32 = 15;
    pub const JOIN_IP_MCAST: u32 = 16;
    pub const LEAVE_MCAST: u32 = 17;
    pub const MIGRATE_ID: u32 = 18;
    pub const QUERY: u32 = 19;
    pub const BIND: u32 = 20;
    pub const RESOLVE_ADDR: u32 = 21;
    pub const JOIN_MCAST: u32 = 22;
    /// One past the last.
    pub const COUNT: u32 = 23;
}

/// `RDMA_USER_CM_QUERY_*`.
pub mod query {
    pub const ADDR: u32 = 0;
    pub const PATH: u32 = 1;
    pub const GID: u32 = 2;
}

/// `RDMA_OPTION_*` levels and names.
pub mod option {
    pub const LEVEL_ID: u32 = 0;
    pub const LEVEL_IB: u32 = 1;
    pub const ID_TOS: u32 = 0;
    pub const ID_REUSEADDR: u32 = 1;
    pub const ID_AFONLY: u32 = 2;
    pub const ID_ACK_TIMEOUT: u32 = 3;
    pub const IB_PATH: u32 = 1;
}

/// `AF_IB` (`<infiniband/ib.h>`).
pub const AF_IB: u16 = 27;

/// `struct rdma_ucm_cmd_hdr`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct rdma_ucm_cmd_hdr {
    pub cmd: u32,
    pub r#in: u16,
    pub out: u16,
}

/// `struct sockaddr_in6`, as the kernel's structures hold one.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct sockaddr_in6 {
    pub sin6_family: u16,
    pub sin6_port: u16,
    pub sin6_flowinfo: u32,
    pub sin6_addr: [u8; 16],
    pub sin6_scope_id: u32,
}

/// `struct __kernel_sockaddr_storage`.
#[repr(C, align(8))]
#[derive(Clone, Copy)]
pub struct sockaddr_storage {
    pub bytes: [u8; 128],
}

impl Default for sockaddr_storage {
    fn default() -> Self {
        sockaddr_storage { bytes: [0; 128] }
    }
}

/// `struct rdma_ucm_create_id`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct rdma_ucm_create_id {
    pub uid: u64,
    pub response: u64,
    pub ps: u16,
    pub qp_type: u8,
    pub reserved: [u8; 5],
}

/// `struct rdma_ucm_create_id_resp`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct rdma_ucm_create_id_resp {
    pub id: u32,
}

/// `struct rdma_ucm_destroy_id`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct rdma_ucm_destroy_id {
    pub response: u64,
    pub id: u32,
    pub reserved: u32,
}

/// `struct rdma_ucm_join_ip_mcast`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct rdma_ucm_join_ip_mcast {
    pub response: u64,
    pub uid: u64,
    pub addr: sockaddr_in6,
    pub id: u32,
}

/// `struct rdma_ucm_join_mcast`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct rdma_ucm_join_mcast {
    pub response: u64,
    pub uid: u64,
    pub id: u32,
    pub addr_size: u16,
    pub join_flags: u16,
    pub addr: sockaddr_storage,
}

/// `RDMA_MC_JOIN_FLAG_FULLMEMBER` and `RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER`.
pub const MC_JOIN_FLAG_FULLMEMBER: u16 = 0;
pub const MC_JOIN_FLAG_SENDONLY_FULLMEMBER: u16 = 1;

/// `struct rdma_ucm_destroy_id_resp` (and `rdma_ucm_migrate_resp`).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct rdma_ucm_destroy_id_resp {
    pub events_reported: u32,
}

/// `struct rdma_ucm_bind_ip`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct rdma_ucm_bind_ip {
    pub response: u64,
    pub addr: sockaddr_in6,
    pub id: u32,
}

/// `struct rdma_ucm_bind`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct rdma_ucm_bind {
    pub id: u32,
    pub addr_size: u16,
    pub reserved: u16,
    pub addr: sockaddr_storage,
}

/// `struct rdma_ucm_resolve_ip`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct rdma_ucm_resolve_ip {
    pub src_addr: sockaddr_in6,
    pub dst_addr: sockaddr_in6,
    pub id: u32,
    pub timeout_ms: u32,
}

/// `struct rdma_ucm_resolve_addr`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct rdma_ucm_resolve_addr {
    pub id: u32,
    pub timeout_ms: u32,
    pub src_size: u16,
    pub dst_size: u16,
    pub reserved: u32,
    pub src_addr: sockaddr_storage,
    pub dst_addr: sockaddr_storage,
}

/// `struct rdma_ucm_resolve_route`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct rdma_ucm_resolve_route {
    pub id: u32,
    pub timeout_ms: u32,
}

/// `struct rdma_ucm_query`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct rdma_ucm_query {
    pub response: u64,
    pub id: u32,
    pub option: u32,
}

/// `struct rdma_ucm_query_route_resp`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct rdma_ucm_query_route_resp {
    pub node_guid: u64,
    pub ib_route: [super::ib_user_path_rec; 2],
    pub src_addr: sockaddr_in6,
    pub dst_addr: sockaddr_in6,
    pub num_paths: u32,
    pub port_num: u8,
    pub reserved: [u8; 3],
    pub ibdev_index: u32,
    pub reserved1: u32,
}

/// `struct rdma_ucm_query_addr_resp`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct rdma_ucm_query_addr_resp {
    pub node_guid: u64,
    pub port_num: u8,
    pub reserved: u8,
    pub pkey: u16,
    pub src_size: u16,
    pub dst_size: u16,
    pub src_addr: sockaddr_storage,
    pub dst_addr: sockaddr_storage,
    pub ibdev_index: u32,
    pub reserved1: u32,
}

/// `struct ib_path_rec_data` (`<rdma/ib_user_sa.h>`): a path record as the SA's MAD lays
/// it out (big-endian, 64 bytes).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ib_path_rec_data {
    pub flags: u32,
    pub reserved: u32,
    pub path_rec: [u8; 64],
}

impl Default for ib_path_rec_data {
    fn default() -> Self {
        ib_path_rec_data {
            flags: 0,
            reserved: 0,
            path_rec: [0; 64],
        }
    }
}

/// `struct rdma_ucm_query_path_resp` with room for one path (the kernel writes as many
/// as the answer's size holds).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct rdma_ucm_query_path_resp {
    pub num_paths: u32,
    pub reserved: u32,
    pub path_data: [ib_path_rec_data; 1],
}

/// `struct rdma_ucm_conn_param`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct rdma_ucm_conn_param {
    pub qp_num: u32,
    pub qkey: u32,
    pub private_data: [u8; RDMA_MAX_PRIVATE_DATA],
    pub private_data_len: u8,
    pub srq: u8,
    pub responder_resources: u8,
    pub initiator_depth: u8,
    pub flow_control: u8,
    pub retry_count: u8,
    pub rnr_retry_count: u8,
    pub valid: u8,
}

impl Default for rdma_ucm_conn_param {
    fn default() -> Self {
        // SAFETY: plain integers and byte arrays: all zeros is a valid value.
        unsafe { std::mem::zeroed() }
    }
}

/// `struct rdma_ucm_ud_param`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct rdma_ucm_ud_param {
    pub qp_num: u32,
    pub qkey: u32,
    pub ah_attr: super::ib_uverbs_ah_attr,
    pub private_data: [u8; RDMA_MAX_PRIVATE_DATA],
    pub private_data_len: u8,
    pub reserved: [u8; 7],
}

/// `struct rdma_ucm_ece`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct rdma_ucm_ece {
    pub vendor_id: u32,
    pub attr_mod: u32,
}

/// `struct rdma_ucm_connect`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct rdma_ucm_connect {
    pub conn_param: rdma_ucm_conn_param,
    pub id: u32,
    pub reserved: u32,
    pub ece: rdma_ucm_ece,
}

/// `struct rdma_ucm_listen`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct rdma_ucm_listen {
    pub id: u32,
    pub backlog: u32,
}

/// `struct rdma_ucm_accept`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct rdma_ucm_accept {
    pub uid: u64,
    pub conn_param: rdma_ucm_conn_param,
    pub id: u32,
    pub reserved: u32,
    pub ece: rdma_ucm_ece,
}

/// `struct rdma_ucm_reject`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct rdma_ucm_reject {
    pub id: u32,
    pub private_data_len: u8,
    pub reason: u8,
    pub reserved: [u8; 2],
    pub private_data: [u8; RDMA_MAX_PRIVATE_DATA],
}

impl Default for rdma_ucm_reject {
    fn default() -> Self {
        // SAFETY: plain integers and byte arrays: all zeros is a valid value.
        unsafe { std::mem::zeroed() }
    }
}

/// `struct rdma_ucm_disconnect`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct rdma_ucm_disconnect {
    pub id: u32,
}

/// `struct rdma_ucm_init_qp_attr`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct rdma_ucm_init_qp_attr {
    pub response: u64,
    pub id: u32,
    pub qp_state: u32,
}

/// `struct rdma_ucm_notify`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct rdma_ucm_notify {
    pub id: u32,
    pub event: u32,
}

/// `struct rdma_ucm_get_event`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct rdma_ucm_get_event {
    pub response: u64,
}

/// The union of `struct rdma_ucm_event_resp`.
#[repr(C)]
#[derive(Clone, Copy)]
pub union rdma_ucm_event_param {
    pub conn: rdma_ucm_conn_param,
    pub ud: rdma_ucm_ud_param,
}

/// `struct rdma_ucm_event_resp`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct rdma_ucm_event_resp {
    pub uid: u64,
    pub id: u32,
    pub event: u32,
    pub status: u32,
    pub param: rdma_ucm_event_param,
    pub reserved: u32,
    pub ece: rdma_ucm_ece,
}

impl Default for rdma_ucm_event_resp {
    fn default() -> Self {
        // SAFETY: plain integers and byte arrays (in the union too): all zeros is a valid
        // value.
        unsafe { std::mem::zeroed() }
    }
}

/// `struct rdma_ucm_set_option`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct rdma_ucm_set_option {
    pub optval: u64,
    pub id: u32,
    pub level: u32,
    pub optname: u32,
    pub optlen: u32,
}

/// `struct rdma_ucm_migrate_id`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct rdma_ucm_migrate_id {
    pub response: u64,
    pub id: u32,
    pub fd: u32,
}
