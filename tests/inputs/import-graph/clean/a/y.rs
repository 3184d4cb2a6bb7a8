pub fn g() {
    // super::x::h() in a comment is no arrow, nor "super::x" in a string.
    let _ = "super::x";
    super::super::b::p::f();
}

#[cfg(test)]
mod tests {
    #[test]
    fn back() {
        super::super::x::entry::f()
    }
}
