pub fn g() {}
