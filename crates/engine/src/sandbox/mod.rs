//! The kernel's confinement of a step steward does not trust — a maker or a checker —
//! so that "commit is the only side effect" holds whatever the step does. Landlock (the
//! `landlock` crate, kept by Landlock's maintainers) limits what it may read and write,
//! which TCP ports it may connect to or bind, and scopes signals and abstract Unix sockets
//! to its own process tree.
//!
//! The ruleset is built here, in the daemon, as a file descriptor ([`Confinement`]): adding
//! rules restricts nobody. Only the step's child, between its clone and its exec, calls
//! `landlock_restrict_self` on it (see [`crate::process`]), so the daemon itself is never
//! restricted, and a step's own children inherit its confinement.
//!
//! Beside it: [`system`], a second Landlock layer that keeps `/etc`'s secrets from every
//! step; [`net`], a seccomp filter for the sockets Landlock cannot see (UDP, raw,
//! packet); [`tmp`], a private `/tmp` in a mount namespace of the step's own. Made ahead,
//! off a step's path: [`pool`], its namespaces; [`filtered`], threads that carry the
//! filter for its child to inherit.

pub mod filtered;
pub mod net;
pub mod pool;
pub mod system;
pub mod tmp;

use std::ffi::CString;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use landlock::{
    path_beneath_rules, Access, AccessFs, AccessNet, CompatLevel, Compatible, NetPort, Ruleset,
    RulesetAttr, RulesetCreatedAttr, Scope, ABI,
};

pub use net::Net;

/// What one step may do: read (and run) beneath `read`, read and write beneath `write`,
/// and reach `net`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    pub read: Vec<PathBuf>,
    pub write: Vec<PathBuf>,
    pub net: Net,
    /// The folder mounted over `/tmp` for the step (its run's `scratch/tmp`), where the
    /// kernel allows a mount namespace.
    pub tmp: Option<PathBuf>,
}

/// What every step needs to read to run at all: the system's programs, libraries and
/// configuration. Not `/proc` (another process's environment is there), not `/home`, not
/// `/root`, not `/tmp`, not steward's state or config.
pub const SYSTEM_READ: &[&str] = &[
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt",
];

/// Devices every step may read and write.
pub const DEVICES: &[&str] = &[
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/random",
    "/dev/urandom",
];

/// What the running kernel's Landlock can enforce.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Support {
    /// Landlock's ABI version (0: none).
    pub abi: i32,
}

impl Support {
    /// This kernel's support, asked once.
    pub fn current() -> Support {
        static ABI_VERSION: OnceLock<i32> = OnceLock::new();
        let abi = *ABI_VERSION.get_or_init(|| {
            // SAFETY: landlock_create_ruleset(NULL, 0, LANDLOCK_CREATE_RULESET_VERSION)
            // only reports the ABI version; it creates nothing.
            let v = unsafe {
                libc::syscall(
                    libc::SYS_landlock_create_ruleset,
                    std::ptr::null::<libc::c_void>(),
                    0usize,
                    1u32,
                )
            };
            let kernel = v.max(0) as i32;
            // STEWARD_SANDBOX_ABI=N makes steward act as on a kernel with Landlock ABI N at
            // most (0: none), to see and test what an older kernel gives.
            match std::env::var("STEWARD_SANDBOX_ABI")
                .ok()
                .and_then(|n| n.parse::<i32>().ok())
            {
                Some(cap) => kernel.min(cap.max(0)),
                None => kernel,
            }
        });
        Support { abi }
    }

    pub fn filesystem(&self) -> bool {
        self.abi >= 1
    }

    pub fn tcp(&self) -> bool {
        self.abi >= 4
    }

    pub fn scoping(&self) -> bool {
        self.abi >= 6
    }

    /// The features a policy needs that this kernel lacks, in words.
    pub fn missing(&self, net: &Net) -> Vec<&'static str> {
        let mut missing = Vec::new();
        if !self.filesystem() {
            return vec!["no Landlock"];
        }
        if !self.tcp() && *net != Net::Any {
            missing.push("no TCP rules");
        }
        if !self.scoping() {
            missing.push("no signal and socket scoping");
        }
        missing
    }

    /// One line for start-up: `sandbox: Landlock ABI 7 (filesystem, TCP ports, scoping)`.
    pub fn describe(&self) -> String {
        if !self.filesystem() {
            return "sandbox: unavailable (this kernel has no Landlock; steps run unconfined unless [sandbox] require = true refuses them)".into();
        }
        let mut has = vec!["filesystem"];
        if self.tcp() {
            has.push("TCP ports");
        }
        if self.scoping() {
            has.push("signal and socket scoping");
        }
        let missing = self.missing(&Net::None);
        let state = if missing.is_empty() {
            String::new()
        } else {
            format!(", partial: {}", missing.join(", "))
        };
        format!(
            "sandbox: Landlock ABI {} ({}{state})",
            self.abi,
            has.join(", ")
        )
    }
}

/// A built ruleset, ready for a child to restrict itself with, and what it enforces.
pub struct Confinement {
    fd: Option<OwnedFd>,
    /// The system layer (kept by [`system`] for every step; -1: none).
    system: RawFd,
    seccomp: Option<&'static net::Filter>,
    tmp: Option<CString>,
    /// A mount namespace of its own (with `masks` covered), where the kernel allows it.
    namespace: bool,
    masks: &'static [system::Mask],
    /// That namespace, made ahead (else the child makes it).
    made_ahead: Option<pool::Ready>,
    /// `full` or `partial (no TCP rules)`: for the run record and the runlog.
    pub state: String,
    /// What the step may do over UDP, and where its `/tmp` is, in words.
    pub notes: Vec<String>,
}

impl std::fmt::Debug for Confinement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Confinement")
            .field("state", &self.state)
            .field("notes", &self.notes)
            .finish()
    }
}

/// What the child needs of a [`Confinement`]: descriptors and pointers only, valid while
/// the confinement lives (it outlives the spawn).
#[derive(Debug, Clone, Copy)]
pub struct ChildConfinement {
    landlock: RawFd,
    system: RawFd,
    seccomp: Option<&'static net::Filter>,
    /// The filter is on already: the child was cloned from a thread that carries it.
    seccomp_inherited: bool,
    namespace: bool,
    /// A namespace made ahead to join (-1: the child makes its own).
    made_ahead: RawFd,
    tmp: *const libc::c_char,
    masks: *const system::Mask,
    masks_len: usize,
}

// SAFETY: the pointers are read only by the spawned child, while their owner lives.
unsafe impl Send for ChildConfinement {}
unsafe impl Sync for ChildConfinement {}

impl ChildConfinement {
    /// Nothing to apply.
    pub const NONE: ChildConfinement = ChildConfinement {
        landlock: -1,
        system: -1,
        seccomp: None,
        seccomp_inherited: false,
        namespace: false,
        made_ahead: -1,
        tmp: std::ptr::null(),
        masks: std::ptr::null(),
        masks_len: 0,
    };

    pub fn is_none(&self) -> bool {
        self.landlock < 0 && self.system < 0 && self.seccomp.is_none() && !self.namespace
    }

    /// The socket filter the child must run under, if any.
    pub fn filter(&self) -> Option<&'static net::Filter> {
        self.seccomp
    }

    /// The same, for a child cloned from a thread that carries the filter already
    /// ([`filtered`]): it does not install it again.
    pub fn with_filter_inherited(self) -> ChildConfinement {
        ChildConfinement {
            seccomp_inherited: true,
            ..self
        }
    }
}

impl Confinement {
    /// What the child applies just before exec.
    pub fn child(&self) -> ChildConfinement {
        ChildConfinement {
            landlock: self.fd.as_ref().map_or(-1, |f| f.as_raw_fd()),
            system: self.system,
            seccomp: self.seccomp,
            seccomp_inherited: false,
            namespace: self.namespace,
            made_ahead: self.made_ahead.as_ref().map_or(-1, pool::Ready::fd),
            tmp: self.tmp.as_ref().map_or(std::ptr::null(), |t| t.as_ptr()),
            masks: self.masks.as_ptr(),
            masks_len: self.masks.len(),
        }
    }
}

/// Why a step cannot be confined as asked.
#[derive(Debug, thiserror::Error)]
#[error("sandbox: {0}")]
pub struct SandboxError(String);

/// Builds the ruleset for `policy`. With `require`, a kernel that cannot enforce all of it
/// is an error; otherwise what it can is enforced and the state says what is missing.
pub fn confine(policy: &Policy, require: bool) -> Result<Confinement, SandboxError> {
    let support = Support::current();
    let missing = support.missing(&policy.net);
    if require && !missing.is_empty() {
        return Err(SandboxError(format!(
            "required, but this kernel has {}",
            missing.join(", ")
        )));
    }
    let seccomp = net::filter(&policy.net);
    let mut notes = vec![net::udp(&policy.net).to_string()];
    if policy.net != Net::Any && seccomp.is_none() {
        notes[0] = "UDP not confined (no seccomp filter for this architecture)".into();
    }
    let namespace = tmp::supported().is_ok();
    let masks = if namespace { system::masks() } else { &[] };
    let made_ahead = if namespace { pool::take(masks) } else { None };
    let tmp = match (&policy.tmp, tmp::supported()) {
        (Some(dir), Ok(())) => {
            notes.push("private /tmp".into());
            CString::new(dir.as_os_str().as_encoded_bytes()).ok()
        }
        (Some(_), Err(why)) => {
            notes.push(format!("no /tmp ({why})"));
            None
        }
        (None, _) => {
            notes.push(
                "no /tmp (its own files are under /tmp, which a private one would hide)".into(),
            );
            None
        }
    };
    if !support.filesystem() {
        return Ok(Confinement {
            fd: None,
            system: -1,
            seccomp,
            tmp,
            namespace,
            masks,
            made_ahead,
            state: "off (no Landlock on this kernel)".into(),
            notes,
        });
    }
    let abi = ABI::from(support.abi);
    let err = |e: landlock::RulesetError| SandboxError(e.to_string());
    let mut ruleset = Ruleset::default()
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(AccessFs::from_all(abi))
        .map_err(err)?;
    // A kernel without a feature has no rights for it: asking for none is an error.
    if policy.net != Net::Any && support.tcp() {
        ruleset = ruleset
            .handle_access(AccessNet::from_all(abi))
            .map_err(err)?;
    }
    if support.scoping() {
        ruleset = ruleset.scope(Scope::from_all(abi)).map_err(err)?;
    }
    let mut created = ruleset.create().map_err(err)?;
    let read = SYSTEM_READ
        .iter()
        .map(PathBuf::from)
        .chain(policy.read.iter().cloned());
    created = created
        .add_rules(path_beneath_rules(read, AccessFs::from_read(abi)))
        .map_err(err)?
        .add_rules(path_beneath_rules(
            DEVICES
                .iter()
                .map(Path::new)
                .chain(policy.write.iter().map(PathBuf::as_path))
                // Seen through its mount over /tmp, the folder is the mount's root: it
                // needs a rule of its own (its parent's does not reach across the mount).
                .chain(
                    policy
                        .tmp
                        .iter()
                        .filter(|_| tmp.is_some())
                        .map(PathBuf::as_path),
                ),
            AccessFs::from_all(abi),
        ))
        .map_err(err)?;
    if let (Net::Ports(ports), true) = (&policy.net, support.tcp()) {
        for port in ports {
            created = created
                .add_rule(NetPort::new(*port, AccessNet::ConnectTcp))
                .map_err(err)?;
        }
    }
    let state = if missing.is_empty() {
        "full".to_string()
    } else {
        format!("partial ({})", missing.join(", "))
    };
    // Masked in the step's namespace, or else fenced off by a Landlock layer.
    let system = if namespace {
        -1
    } else {
        system::layer(support.abi).unwrap_or(-1)
    };
    if !namespace && system < 0 {
        notes.push("the system's secrets not fenced off (cannot build the layer)".into());
    }
    Ok(Confinement {
        fd: created.into(),
        system,
        seccomp,
        tmp,
        namespace,
        masks,
        made_ahead,
        state,
        notes,
    })
}

/// In a step's child, just before exec: its mount namespace (the secrets masked, its
/// private `/tmp`; one made ahead by [`pool`] when there is one), no new privileges
/// (Landlock and seccomp require it, and a setuid program must not lift the confinement),
/// the system layer, the step's ruleset, then the socket filter. Only system calls: this
/// runs between clone and exec.
///
/// # Safety
/// Call only in a freshly cloned child that shares no filesystem context, while the
/// [`Confinement`] `c` came from lives; `cwd` is the child's working folder (joining a
/// namespace made ahead moves the child to its root), a NUL-terminated path.
pub unsafe fn restrict_self(c: ChildConfinement, cwd: *const libc::c_char) -> Result<(), i32> {
    if c.is_none() {
        return Ok(());
    }
    let errno = || *libc::__errno_location();
    // Joining moves the child to the namespace's root; only an absolute folder is
    // found again from there.
    let absolute = !cwd.is_null() && *cwd == b'/' as libc::c_char;
    let entered = match (c.namespace, c.made_ahead) {
        (false, _) => 0,
        (true, ns) if ns >= 0 && absolute => pool::join(ns, cwd, c.tmp),
        (true, _) => tmp::enter(c.tmp, c.masks, c.masks_len),
    };
    if entered == -1 {
        return Err(errno());
    }
    if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == -1 {
        return Err(errno());
    }
    for fd in [c.system, c.landlock] {
        if fd >= 0 && libc::syscall(libc::SYS_landlock_restrict_self, fd, 0u32) == -1 {
            return Err(errno());
        }
    }
    if let (Some(filter), false) = (c.seccomp, c.seccomp_inherited) {
        let installed = libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_SET_MODE_FILTER,
            0u32,
            &filter.fprog,
        );
        if installed == -1 {
            return Err(errno());
        }
    }
    Ok(())
}

/// The confined steps running now, by what the control socket can see of a client: its
/// step cgroup's name and its process group. A confined step may not command the daemon
/// through its socket (Landlock does not cover connecting to a Unix socket by its path):
/// it could otherwise approve, go live or start runs.
static CONFINED: std::sync::Mutex<Vec<(Option<String>, i32)>> = std::sync::Mutex::new(Vec::new());

fn confined() -> std::sync::MutexGuard<'static, Vec<(Option<String>, i32)>> {
    CONFINED.lock().unwrap_or_else(|p| p.into_inner())
}

/// A confined step's registration, removed when dropped (its step ended).
#[derive(Debug)]
pub struct Registration {
    entry: (Option<String>, i32),
}

/// Registers a confined step: its cgroup folder (if it has one) and its process group.
pub fn register(cgroup: Option<&Path>, pgid: i32) -> Registration {
    let entry = (
        cgroup
            .and_then(|c| c.file_name())
            .map(|n| n.to_string_lossy().into_owned()),
        pgid,
    );
    confined().push(entry.clone());
    Registration { entry }
}

impl Drop for Registration {
    fn drop(&mut self) {
        let mut list = confined();
        if let Some(i) = list.iter().position(|e| *e == self.entry) {
            list.swap_remove(i);
        }
    }
}

/// Whether the process `pid` belongs to a confined step: it sits in a confined step's
/// cgroup (which it cannot leave: the cgroup files are not writable to it), or in its
/// process group.
pub fn is_confined_step(pid: i32) -> bool {
    let list = confined();
    if list.is_empty() {
        return false;
    }
    let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
    let own = cgroup
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .and_then(|p| p.rsplit('/').next())
        .map(str::to_string);
    // Field 5 of /proc/PID/stat, after the parenthesised command name.
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let pgid = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().nth(2))
        .and_then(|g| g.parse::<i32>().ok());
    list.iter().any(|(name, group)| {
        (name.is_some() && *name == own) || (pgid == Some(*group) && *group > 0)
    })
}
