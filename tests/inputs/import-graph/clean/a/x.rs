pub mod entry {
    pub fn f() {
        super::super::y::g()
    }
}
