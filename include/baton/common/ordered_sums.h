// A map from ordered keys to byte counts that answers "how many bytes lie
// below this key" in O(log n): what admission needs to count the bytes that
// go before a request (earlier deadlines, earlier arrivals) without walking
// every live request. A red-black tree (libstdc++'s policy-based tree) whose
// nodes also hold the sum of their subtree.
#pragma once

#include <cstdint>
#include <functional>

#include <ext/pb_ds/assoc_container.hpp>
#include <ext/pb_ds/tree_policy.hpp>

namespace baton {
namespace detail {

// The node update of the tree: each node's metadata is its subtree's sum.
template <class NodeCItr, class NodeItr, class CmpFn, class Alloc>
struct SubtreeSum {
  using metadata_type = std::uint64_t;

  void operator()(NodeItr it, NodeCItr end) {
    std::uint64_t sum = (*it)->second;
    if (NodeItr l = it.get_l_child(); l != end) sum += l.get_metadata();
    if (NodeItr r = it.get_r_child(); r != end) sum += r.get_metadata();
    const_cast<metadata_type&>(it.get_metadata()) = sum;  // the tree's documented way to set it
  }

  template <class Key>
  [[nodiscard]] std::uint64_t sum_below(const Key& key) const {
    std::uint64_t sum = 0;
    const NodeCItr end = node_end();
    for (NodeCItr it = node_begin(); it != end;) {
      const NodeCItr l = it.get_l_child();
      if (CmpFn()((*it)->first, key)) {
        if (l != end) sum += l.get_metadata();
        sum += (*it)->second;
        it = it.get_r_child();
      } else {
        it = l;
      }
    }
    return sum;
  }

  virtual NodeCItr node_begin() const = 0;
  virtual NodeCItr node_end() const = 0;
  virtual ~SubtreeSum() = default;
};

}  // namespace detail

template <typename Key, typename Less = std::less<Key>>
class OrderedSums {
 public:
  // Sets the value of `key`; 0 removes it. O(log n).
  void set(const Key& key, std::uint64_t value) {
    tree_.erase(key);
    if (value != 0) tree_.insert({key, value});
  }
  void erase(const Key& key) { tree_.erase(key); }
  // The sum of the values of every key strictly below `key`. O(log n).
  [[nodiscard]] std::uint64_t sum_below(const Key& key) const { return tree_.sum_below(key); }
  [[nodiscard]] std::size_t size() const { return tree_.size(); }

 private:
  __gnu_pbds::tree<Key, std::uint64_t, Less, __gnu_pbds::rb_tree_tag, detail::SubtreeSum> tree_;
};

}  // namespace baton
