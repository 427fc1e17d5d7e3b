//! Which programs are watched by default: a Python interpreter, or a `.py` file.

use std::ffi::OsStr;
use std::path::Path;

/// Whether `program` is a Python interpreter (`python`, `python3`,
/// `python3.11`, a path to one) or a Python script (`train.py`).
pub fn is_python(program: &OsStr) -> bool {
    let path = Path::new(program);
    if path.extension().is_some_and(|e| e == "py") {
        return true;
    }
    let Some(name) = path.file_name().and_then(OsStr::to_str) else { return false };
    let Some(version) = name.strip_prefix("python") else { return false };
    version.is_empty()
        || version.split('.').all(|part| !part.is_empty() && part.bytes().all(|b| b.is_ascii_digit()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interpreters_and_scripts_are_python_and_nothing_else_is() {
        for yes in
            ["python", "python3", "python3.11", "/usr/bin/python3.13", "train.py", "./bench/zoo/story.py"]
        {
            assert!(is_python(OsStr::new(yes)), "{yes}");
        }
        for no in ["drove", "python-config", "pythonx", "python3.", "/bin/sh", "train.pyc", "torchrun"] {
            assert!(!is_python(OsStr::new(no)), "{no}");
        }
    }
}
