//! How a rank ended, in the shell's words and numbers.

use std::os::unix::process::ExitStatusExt as _;
use std::process::ExitStatus;

/// The name of signal `sig` (`SIGTERM`, ...; else `signal N`).
pub fn signal_name(sig: i32) -> String {
    match sig {
        libc::SIGINT => "SIGINT".into(),
        libc::SIGTERM => "SIGTERM".into(),
        libc::SIGHUP => "SIGHUP".into(),
        libc::SIGKILL => "SIGKILL".into(),
        libc::SIGSEGV => "SIGSEGV".into(),
        libc::SIGABRT => "SIGABRT".into(),
        libc::SIGBUS => "SIGBUS".into(),
        libc::SIGPIPE => "SIGPIPE".into(),
        n => format!("signal {n}"),
    }
}

/// The shell-style exit code of a process: its code, or 128 + the signal.
pub fn exit_code(status: &ExitStatus) -> u8 {
    match (status.code(), status.signal()) {
        (Some(c), _) => c.clamp(0, 255) as u8,
        (None, Some(s)) => signal_exit_code(s),
        (None, None) => 1,
    }
}

/// 128 + `sig`, the exit code of a process ended by signal `sig`.
pub fn signal_exit_code(sig: i32) -> u8 {
    (128 + sig).clamp(0, 255) as u8
}

/// `exited with code N` or `was killed by SIGNAL`.
pub fn describe(status: &ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(c), _) => format!("exited with code {c}"),
        (None, Some(s)) => format!("was killed by {}", signal_name(s)),
        (None, None) => format!("ended with {status}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_follow_the_shell_convention() {
        assert_eq!(exit_code(&ExitStatus::from_raw(3 << 8)), 3);
        assert_eq!(exit_code(&ExitStatus::from_raw(libc::SIGTERM)), 143);
        assert_eq!(exit_code(&ExitStatus::from_raw(libc::SIGKILL)), 137);
        assert_eq!(describe(&ExitStatus::from_raw(libc::SIGKILL)), "was killed by SIGKILL");
    }
}
