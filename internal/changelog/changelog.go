// Package changelog owns the record of which entries of a store changed
// between two looks of its one consumer, so that the consumer revisits
// only those. Until the consumer first takes the record nothing is kept (a
// store nobody follows keeps no list); the first take says All. The record
// is bounded: past the limit its owner gives, revisiting everything costs
// no more, and it collapses into All. It is not safe for concurrent use:
// its owner's lock guards it.
package changelog

// Log records changed keys for one consumer. The zero value is ready.
type Log[K comparable] struct {
	tracking bool
	all      bool
	keys     map[K]struct{}
	// last is how many keys the last take listed: the next record is made
	// that size, so a storm's record does not grow table by table.
	last int
}

// Mark records that the entry under key changed; past limit keys the
// record becomes All.
func (l *Log[K]) Mark(key K, limit int) {
	if !l.tracking || l.all {
		return
	}
	if l.keys == nil {
		l.keys = make(map[K]struct{}, min(l.last, limit))
	}
	l.keys[key] = struct{}{}
	if len(l.keys) > limit {
		l.MarkAll()
	}
}

// MarkAll records that any entry may have changed.
func (l *Log[K]) MarkAll() {
	if l.tracking {
		l.all, l.keys = true, nil
	}
}

// Take returns what was recorded and starts a new record. The map is the
// caller's.
func (l *Log[K]) Take() (all bool, keys map[K]struct{}) {
	if !l.tracking {
		l.tracking = true
		return true, nil
	}
	all, keys = l.all, l.keys
	l.all, l.keys, l.last = false, nil, len(keys)
	return all, keys
}
