//! The process's resident memory, as the memory tests and the benchmark
//! measure it.

/// Bytes of one page, from the auxiliary vector the kernel gave the
/// process (`AT_PAGESZ`), so no FFI is needed.
fn page_size() -> Option<u64> {
    const AT_PAGESZ: u64 = 6;
    let auxv = std::fs::read("/proc/self/auxv").ok()?;
    auxv.chunks_exact(16).find_map(|pair| {
        let key = u64::from_ne_bytes(pair[..8].try_into().ok()?);
        let value = u64::from_ne_bytes(pair[8..].try_into().ok()?);
        (key == AT_PAGESZ).then_some(value)
    })
}

/// Resident bytes of this process (resident pages of `/proc/self/statm` ×
/// page size), or why they cannot be read here (they can on Linux only).
///
/// ```
/// if let Ok(bytes) = kiln_tests::rss::resident_bytes() {
///     assert!(bytes > 0);
/// }
/// ```
pub fn resident_bytes() -> Result<u64, String> {
    let statm = std::fs::read_to_string("/proc/self/statm")
        .map_err(|e| format!("/proc/self/statm is not readable ({e}); RSS is measured on Linux"))?;
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|field| field.parse().ok())
        .ok_or_else(|| format!("/proc/self/statm has no resident field: {statm:?}"))?;
    let page = page_size().ok_or("/proc/self/auxv has no page size")?;
    Ok(pages * page)
}
