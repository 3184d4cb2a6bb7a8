// A small template-heavy translation unit for the g++ driver in the
// real-programs suite: the compiler (cc1plus) instantiates containers,
// algorithms and streams, which is what makes C++ compiles allocate.
#include <algorithm>
#include <map>
#include <memory>
#include <numeric>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

template <int N> struct Fib { static constexpr long v = Fib<N - 1>::v + Fib<N - 2>::v; };
template <> struct Fib<0> { static constexpr long v = 0; };
template <> struct Fib<1> { static constexpr long v = 1; };

template <typename T> std::string show(const std::vector<T> &v) {
    std::ostringstream o;
    for (const auto &x : v) o << x << ',';
    return o.str();
}

template <typename K, typename V> std::map<V, std::set<K>> invert(const std::unordered_map<K, V> &m) {
    std::map<V, std::set<K>> r;
    for (const auto &[k, v] : m) r[v].insert(k);
    return r;
}

template <typename... Ts> auto sizes(const std::tuple<Ts...> &t) {
    return std::apply([](const auto &...xs) { return (sizeof(xs) + ...); }, t);
}

struct Shape {
    virtual ~Shape() = default;
    virtual double area() const = 0;
};
template <int Sides> struct Regular : Shape {
    double side;
    explicit Regular(double s) : side(s) {}
    double area() const override { return Sides * side * side / 4.0; }
};

long run() {
    std::unordered_map<std::string, int> words{{"a", 1}, {"b", 2}, {"c", 1}};
    auto inv = invert(words);
    std::vector<std::unique_ptr<Shape>> shapes;
    shapes.push_back(std::make_unique<Regular<3>>(1.0));
    shapes.push_back(std::make_unique<Regular<4>>(2.0));
    shapes.push_back(std::make_unique<Regular<6>>(3.0));
    std::vector<double> areas;
    std::transform(shapes.begin(), shapes.end(), std::back_inserter(areas),
                   [](const auto &s) { return s->area(); });
    std::sort(areas.begin(), areas.end());
    auto t = std::make_tuple(1, 2.0, 'c', std::string("s"));
    return Fib<40>::v % 97 + static_cast<long>(inv.size()) + static_cast<long>(show(areas).size()) +
           static_cast<long>(sizes(t)) + std::accumulate(areas.begin(), areas.end(), 0L);
}
