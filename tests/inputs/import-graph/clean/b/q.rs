pub struct Q;

pub fn make() -> Q {
    Q
}
