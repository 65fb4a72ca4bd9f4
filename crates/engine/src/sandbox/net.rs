//! The network beyond Landlock's TCP rules: a seccomp filter, installed in the child just
//! before exec, that refuses the sockets Landlock cannot see — UDP, raw and packet
//! sockets, SCTP and the like — as Codex CLI does for its commands. With no network
//! granted, a step may open no Internet socket but a TCP one (whose connects and binds
//! Landlock holds). With TCP ports granted, it may also use UDP, for name resolution
//! (a filter cannot see where a datagram goes). `net = "any"` installs no filter.
//!
//! The filters (built with `seccompiler`, rust-vmm's) are made once and kept: the child
//! only hands the kernel a pointer, or inherits the filter from the thread that cloned it
//! (see [`super::filtered`]).

use std::collections::BTreeMap;
use std::sync::OnceLock;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen as Len, SeccompCmpOp as Op,
    SeccompCondition as Cond, SeccompFilter, SeccompRule, TargetArch,
};

/// What a step may reach over the network.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Net {
    /// No TCP connection or listening socket at all.
    None,
    /// TCP connections to these ports only.
    Ports(Vec<u16>),
    /// Anything: the network is not confined.
    Any,
}

impl Net {
    /// This rule with TCP to `port` allowed too (the model gateway's, for a step that
    /// calls it).
    pub fn with_port(self, port: u16) -> Net {
        match self {
            Net::None => Net::Ports(vec![port]),
            Net::Ports(mut ports) => {
                if !ports.contains(&port) {
                    ports.push(port);
                }
                Net::Ports(ports)
            }
            Net::Any => Net::Any,
        }
    }
}

/// A filter ready for `seccomp(SECCOMP_SET_MODE_FILTER)`: its program, kept for good.
pub struct Filter {
    _program: BpfProgram,
    pub fprog: libc::sock_fprog,
}

impl std::fmt::Debug for Filter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Filter({} instructions)", self.fprog.len)
    }
}

// SAFETY: the program is never changed after it is built, and `fprog` points into it.
unsafe impl Send for Filter {}
unsafe impl Sync for Filter {}

/// What a step may do over UDP under `net`, for the run record and docs/sandbox.md.
pub fn udp(net: &Net) -> &'static str {
    match net {
        Net::None => "no UDP, raw or packet sockets",
        Net::Ports(_) => "UDP allowed (name resolution); no raw or packet sockets",
        Net::Any => "any network",
    }
}

/// The filter for `net` (None for `any`, or where this architecture has no filter).
pub fn filter(net: &Net) -> Option<&'static Filter> {
    static NONE: OnceLock<Option<Filter>> = OnceLock::new();
    static PORTS: OnceLock<Option<Filter>> = OnceLock::new();
    match net {
        Net::Any => None,
        Net::None => NONE.get_or_init(|| build(false)).as_ref(),
        Net::Ports(_) => PORTS.get_or_init(|| build(true)).as_ref(),
    }
}

fn build(udp: bool) -> Option<Filter> {
    let arch = TargetArch::try_from(std::env::consts::ARCH).ok()?;
    let program: BpfProgram = SeccompFilter::new(
        rules(udp).ok()?,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EACCES as u32),
        arch,
    )
    .ok()?
    .try_into()
    .ok()?;
    let fprog = libc::sock_fprog {
        len: program.len() as u16,
        // seccompiler's sock_filter has libc's layout (code, jt, jf, k; repr(C)).
        filter: program.as_ptr() as *mut libc::sock_filter,
    };
    Some(Filter {
        _program: program,
        fprog,
    })
}

/// socket(domain, type, protocol) calls to refuse.
fn rules(udp: bool) -> Result<BTreeMap<i64, Vec<SeccompRule>>, seccompiler::BackendError> {
    // The type's low bits; SOCK_NONBLOCK and SOCK_CLOEXEC ride above them.
    let kind = |t: i32| Cond::new(1, Len::Dword, Op::MaskedEq(0xf), t as u64);
    let domain = |d: i32| Cond::new(0, Len::Dword, Op::Eq, d as u64);
    let mut socket = vec![SeccompRule::new(vec![domain(libc::AF_PACKET)?])?];
    for family in [libc::AF_INET, libc::AF_INET6] {
        let mut refused = vec![
            libc::SOCK_RAW,
            libc::SOCK_RDM,
            libc::SOCK_SEQPACKET,
            libc::SOCK_DCCP,
            10, // SOCK_PACKET, the obsolete packet socket
        ];
        if !udp {
            refused.push(libc::SOCK_DGRAM);
        }
        for t in refused {
            socket.push(SeccompRule::new(vec![domain(family)?, kind(t)?])?);
        }
        // A stream socket of another protocol than TCP (SCTP, MPTCP): Landlock's TCP
        // rules do not hold it.
        socket.push(SeccompRule::new(vec![
            domain(family)?,
            kind(libc::SOCK_STREAM)?,
            Cond::new(2, Len::Dword, Op::Ne, 0)?,
            Cond::new(2, Len::Dword, Op::Ne, libc::IPPROTO_TCP as u64)?,
        ])?);
    }
    let mut rules = BTreeMap::new();
    rules.insert(libc::SYS_socket, socket);
    // io_uring can open sockets without the socket system call.
    rules.insert(libc::SYS_io_uring_setup, vec![]);
    Ok(rules)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_are_built_for_both_confined_modes_and_none_for_any() {
        assert!(filter(&Net::None).is_some());
        assert!(filter(&Net::Ports(vec![443])).is_some());
        assert!(filter(&Net::Any).is_none());
        assert!(filter(&Net::None).unwrap().fprog.len > 10);
    }
}
