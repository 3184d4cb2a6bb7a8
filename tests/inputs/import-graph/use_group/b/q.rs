use super::{p as other, r};

pub struct Q;

pub fn make() -> Q {
    r::g();
    Q
}

pub fn back() -> Q {
    other::f()
}
