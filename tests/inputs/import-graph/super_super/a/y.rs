pub fn g() {
    super::x::h()
}
