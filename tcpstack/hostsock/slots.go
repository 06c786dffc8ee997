package hostsock

// Slots keeps records of a table's host sockets (its forwarded ports) in
// numbered slots, the number their epoll tokens and their owner name them
// by: a freed slot goes to the next record added, so the others keep their
// numbers and the slice does not grow with every port reopened.
type Slots[T any] struct {
	// All holds the records by slot; a free slot holds what Free put
	// there until Add reuses it.
	All  []T
	free []int
}

// Add stores v in a free slot, or a new one, and returns the slot.
func (s *Slots[T]) Add(v T) int {
	if n := len(s.free); n > 0 {
		i := s.free[n-1]
		s.free = s.free[:n-1]
		s.All[i] = v
		return i
	}
	s.All = append(s.All, v)
	return len(s.All) - 1
}

// Free makes slot i free, holding empty until it is reused.
func (s *Slots[T]) Free(i int, empty T) {
	s.All[i] = empty
	s.free = append(s.free, i)
}

// Len returns the number of slots in use.
func (s *Slots[T]) Len() int { return len(s.All) - len(s.free) }
