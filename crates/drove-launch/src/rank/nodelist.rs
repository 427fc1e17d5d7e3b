//! Slurm's host lists, as `SLURM_JOB_NODELIST` writes them: names separated
//! by commas, each with any number of bracketed ranges, e.g.
//! `node[01-04,07]`, `gpu1,gpu3`, `rack[1-2]-n[1-2]`. A range keeps the width
//! of its lower bound (`[08-10]` is `08`, `09`, `10`).

/// A host list that cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the Slurm host list {list:?} cannot be read: {problem}")]
pub struct NodeListError {
    /// The list.
    pub list: String,
    /// What is wrong with it.
    pub problem: String,
}

/// Every host of `list`, in order.
pub fn expand(list: &str) -> Result<Vec<String>, NodeListError> {
    let fail = |problem: String| NodeListError { list: list.to_string(), problem };
    if list.trim().is_empty() {
        return Err(fail("it names no host".into()));
    }
    let mut hosts = Vec::new();
    for item in split_top(list).map_err(fail)? {
        if item.is_empty() {
            return Err(fail("an empty name between commas".into()));
        }
        hosts.extend(expand_name(item).map_err(fail)?);
    }
    Ok(hosts)
}

/// The first host of `list` (where rank 0 of a Slurm step runs).
pub fn first_host(list: &str) -> Result<String, NodeListError> {
    expand(list).map(|hosts| hosts.into_iter().next().expect("expand names at least one host"))
}

/// Splits at the commas outside brackets.
fn split_top(list: &str) -> Result<Vec<&str>, String> {
    let (mut items, mut depth, mut start) = (Vec::new(), 0usize, 0);
    for (i, c) in list.char_indices() {
        match c {
            '[' if depth > 0 => return Err(format!("a bracket inside a bracket at byte {i}")),
            '[' => depth = 1,
            ']' if depth == 0 => return Err(format!("a closing bracket without an opening one at byte {i}")),
            ']' => depth = 0,
            ',' if depth == 0 => {
                items.push(list[start..i].trim());
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth > 0 {
        return Err("a bracket is not closed".into());
    }
    items.push(list[start..].trim());
    Ok(items)
}

/// One name with its bracketed ranges, expanded (the first bracket varies slowest).
fn expand_name(name: &str) -> Result<Vec<String>, String> {
    let Some(open) = name.find('[') else { return Ok(vec![name.to_string()]) };
    let close = open + name[open..].find(']').expect("split_top checked the brackets");
    let (prefix, body, rest) = (&name[..open], &name[open + 1..close], &name[close + 1..]);
    let tails = expand_name(rest)?;
    let mut out = Vec::new();
    for part in body.split(',') {
        for number in range(part.trim())? {
            out.extend(tails.iter().map(|tail| format!("{prefix}{number}{tail}")));
        }
    }
    Ok(out)
}

/// `07` or `01-04`: the numbers, each as wide as the lower bound.
fn range(part: &str) -> Result<Vec<String>, String> {
    let (lo, hi) = part.split_once('-').unwrap_or((part, part));
    let parse = |s: &str| -> Result<u64, String> {
        if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
            return Err(format!("{part:?} is not a number or a range of numbers (like 01-04)"));
        }
        s.parse().map_err(|_| format!("{s:?} is too large"))
    };
    let (a, b) = (parse(lo)?, parse(hi)?);
    if b < a {
        return Err(format!("the range {part:?} runs backwards"));
    }
    if b - a >= 1 << 20 {
        return Err(format!("the range {part:?} names more than a million hosts"));
    }
    let width = lo.len();
    Ok((a..=b).map(|n| format!("{n:0width$}")).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hosts(list: &str) -> Vec<String> {
        expand(list).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn names_and_ranges_expand_as_slurm_writes_them() {
        assert_eq!(hosts("vm"), ["vm"]);
        assert_eq!(hosts("gpu1,gpu3"), ["gpu1", "gpu3"]);
        assert_eq!(hosts("node[01-04,07]"), ["node01", "node02", "node03", "node04", "node07"]);
        assert_eq!(hosts("n[8-10]"), ["n8", "n9", "n10"]);
        assert_eq!(hosts("n[098-101]"), ["n098", "n099", "n100", "n101"]);
        assert_eq!(hosts("a[1-2],b,c[5]"), ["a1", "a2", "b", "c5"]);
        assert_eq!(hosts("rack[1-2]-n[1-2]"), ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]);
        assert_eq!(hosts("node[01-02].cluster"), ["node01.cluster", "node02.cluster"]);
        assert_eq!(first_host("node[03-04,01]").unwrap(), "node03");
    }

    #[test]
    fn a_list_that_cannot_be_read_is_named_with_what_is_wrong() {
        let problem = |list: &str| expand(list).unwrap_err().problem;
        assert_eq!(problem("node[01-04"), "a bracket is not closed");
        assert_eq!(problem("node01]"), "a closing bracket without an opening one at byte 6");
        assert_eq!(problem("n[[1]]"), "a bracket inside a bracket at byte 2");
        assert_eq!(problem("n[4-2]"), "the range \"4-2\" runs backwards");
        assert_eq!(problem("n[a-c]"), "\"a-c\" is not a number or a range of numbers (like 01-04)");
        assert_eq!(problem("a,,b"), "an empty name between commas");
        assert_eq!(problem(""), "it names no host");
        let e = expand("x[1-]").unwrap_err().to_string();
        assert_eq!(
            e,
            "the Slurm host list \"x[1-]\" cannot be read: \"1-\" is not a number or a range of numbers (like 01-04)"
        );
    }
}
