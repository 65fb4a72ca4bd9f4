//! A mount namespace of the step's own, where the kernel allows steward one (root, or
//! CAP_SYS_ADMIN). In it, the step gets a private `/tmp` — its run's `scratch/tmp`,
//! bind-mounted over `/tmp`, as bubblewrap's `--tmpfs /tmp` or nsjail do — so a script
//! that writes `/tmp/x` works, sees no other run's files, and leaves nothing once its
//! run's scratch folder is removed; and the system's secrets are masked
//! ([`super::system::masks`]). Where the kernel refuses it, `/tmp` stays denied and
//! start-up and `steward validate` say why.

use std::sync::OnceLock;

/// Why a step cannot have a mount namespace of its own (and so no private `/tmp`) here.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NoNamespace {
    #[error("turned off by STEWARD_SANDBOX_NAMESPACE=0")]
    TurnedOff,
    #[error("a test step in a mount namespace ended {0}")]
    ProbeFailed(String),
    #[error(
        "the kernel refused a mount namespace ({0}): steward needs root or CAP_SYS_ADMIN for it"
    )]
    Refused(String),
}

/// Whether a step can have a private `/tmp` here; Err says why not. Asked once, by
/// starting `true` in a mount namespace of its own.
pub fn supported() -> Result<(), NoNamespace> {
    static ANSWER: OnceLock<Result<(), NoNamespace>> = OnceLock::new();
    ANSWER.get_or_init(probe).clone()
}

fn probe() -> Result<(), NoNamespace> {
    use std::os::unix::process::CommandExt;
    // STEWARD_SANDBOX_NAMESPACE=0 makes steward act as where the kernel refuses one, to see
    // and test that road (secrets fenced by Landlock, no /tmp).
    if std::env::var("STEWARD_SANDBOX_NAMESPACE").as_deref() == Ok("0") {
        return Err(NoNamespace::TurnedOff);
    }
    let mut cmd = std::process::Command::new("true");
    cmd.stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    // SAFETY: only the unshare and mount system calls run between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            if new_namespace() == 0 {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error())
            }
        });
    }
    match cmd.status() {
        Ok(s) if s.success() => Ok(()),
        Ok(s) => Err(NoNamespace::ProbeFailed(s.to_string())),
        Err(e) => Err(NoNamespace::Refused(e.to_string())),
    }
}

/// In the child: a mount namespace of its own whose mounts do not propagate back.
/// Returns 0, or -1 with errno set. Only system calls.
fn new_namespace() -> libc::c_int {
    // SAFETY: plain system calls on constant arguments.
    unsafe {
        if libc::unshare(libc::CLONE_NEWNS) == -1 {
            return -1;
        }
        libc::mount(
            std::ptr::null(),
            c"/".as_ptr(),
            std::ptr::null(),
            libc::MS_REC | libc::MS_PRIVATE,
            std::ptr::null(),
        )
    }
}

/// In the child, before its confinement: a namespace of its own, each of `masks` covered
/// (a file by `/dev/null`, a folder by an empty read-only tmpfs), and `tmp` (when not
/// null) over `/tmp`. 0, or -1 with errno set.
///
/// # Safety
/// Call only in a freshly cloned child; `tmp` is null or a NUL-terminated path, and
/// `masks` points at `count` masks that outlive the call.
pub unsafe fn enter(
    tmp: *const libc::c_char,
    masks: *const super::system::Mask,
    count: usize,
) -> libc::c_int {
    if new_namespace() == -1 {
        return -1;
    }
    for i in 0..count {
        let mask = &*masks.add(i);
        let done = if mask.folder {
            libc::mount(
                c"tmpfs".as_ptr(),
                mask.path.as_ptr(),
                c"tmpfs".as_ptr(),
                libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                c"size=4k,mode=000".as_ptr() as *const libc::c_void,
            )
        } else {
            libc::mount(
                c"/dev/null".as_ptr(),
                mask.path.as_ptr(),
                std::ptr::null(),
                libc::MS_BIND,
                std::ptr::null(),
            )
        };
        // A secret removed since the list was made needs no mask.
        if done == -1 && *libc::__errno_location() != libc::ENOENT {
            return -1;
        }
    }
    mount_tmp(tmp)
}

/// In the child, in its own namespace: `tmp` (when not null) mounted over `/tmp`. 0, or
/// -1 with errno set.
///
/// # Safety
/// `tmp` is null or a NUL-terminated path.
pub unsafe fn mount_tmp(tmp: *const libc::c_char) -> libc::c_int {
    if tmp.is_null() {
        return 0;
    }
    libc::mount(
        tmp,
        c"/tmp".as_ptr(),
        std::ptr::null(),
        libc::MS_BIND | libc::MS_REC,
        std::ptr::null(),
    )
}
