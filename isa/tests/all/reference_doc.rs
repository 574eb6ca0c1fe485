//! `isa/ISA.md` is the generated reference; it must match the table
//! (`GEARSIM_BLESS=1 cargo test` rewrites it).

#[test]
fn isa_md_matches_the_table() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("ISA.md");
    let want = gearsim_isa::reference::markdown();
    if std::env::var_os("GEARSIM_BLESS").is_some() {
        std::fs::write(&path, &want).unwrap();
    }
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        have == want,
        "isa/ISA.md is stale: run `GEARSIM_BLESS=1 cargo test -p gearsim-isa`"
    );
}
