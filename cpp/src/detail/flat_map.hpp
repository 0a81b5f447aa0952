// Open-addressing hash map from pointer to value, linear probing with
// backward-shift deletion. No allocation per insert: the pool's hot path
// looks up every free here.
#pragma once
#include <cstdint>
#include <cstring>
#include <vector>

namespace vramkit::detail {

template <class V>
class ptr_map {
 public:
  ptr_map() { rehash(1024); }

  V* find(std::uintptr_t key) noexcept {
    std::size_t i = slot(key);
    while (true) {
      auto& e = table_[i];
      if (e.key == key) return &e.value;
      if (e.key == 0) return nullptr;
      i = (i + 1) & mask_;
    }
  }
  const V* find(std::uintptr_t key) const noexcept { return const_cast<ptr_map*>(this)->find(key); }

  // key must not be present and must not be 0.
  void insert(std::uintptr_t key, V value) {
    if ((size_ + 1) * 4 > table_.size() * 3) rehash(table_.size() * 2);
    place(key, value);
    ++size_;
  }

  bool erase(std::uintptr_t key) noexcept {
    std::size_t i = slot(key);
    while (true) {
      if (table_[i].key == key) break;
      if (table_[i].key == 0) return false;
      i = (i + 1) & mask_;
    }
    // Backward-shift: move later entries of the probe run into the hole.
    std::size_t hole = i;
    std::size_t j = (i + 1) & mask_;
    while (table_[j].key != 0) {
      std::size_t home = slot(table_[j].key);
      bool between = (hole <= j) ? (hole < home && home <= j) : (hole < home || home <= j);
      if (!between) {
        table_[hole] = table_[j];
        hole = j;
      }
      j = (j + 1) & mask_;
    }
    table_[hole].key = 0;
    --size_;
    return true;
  }

  std::size_t size() const noexcept { return size_; }

  template <class F>
  void for_each(F&& f) const {
    for (auto& e : table_)
      if (e.key) f(e.key, e.value);
  }

 private:
  struct entry {
    std::uintptr_t key = 0;
    V value{};
  };
  std::size_t slot(std::uintptr_t key) const noexcept {
    return static_cast<std::size_t>((key >> 8) * 0x9E3779B97F4A7C15ull >> 20) & mask_;
  }
  void place(std::uintptr_t key, V value) noexcept {
    std::size_t i = slot(key);
    while (table_[i].key != 0) i = (i + 1) & mask_;
    table_[i].key = key;
    table_[i].value = value;
  }
  void rehash(std::size_t n) {
    std::vector<entry> old;
    old.swap(table_);
    table_.assign(n, entry{});
    mask_ = n - 1;
    for (auto& e : old)
      if (e.key) place(e.key, e.value);
  }
  std::vector<entry> table_;
  std::size_t mask_ = 0;
  std::size_t size_ = 0;
};

}  // namespace vramkit::detail
