package blockpin

import (
	"fmt"
	"sync"
)

// Memory is a Pinner for unit tests: it records pins in memory, pins any
// path, and fails on demand.
type Memory struct {
	mu   sync.Mutex
	pins map[string]bool
	// Fail, when set, is returned by Pin and Unpin for that path.
	Fail map[string]error
	// Calls records "pin <path>" and "unpin <path>" in order.
	Calls []string
}

var _ Pinner = (*Memory)(nil)

// Pin implements Pinner.
func (m *Memory) Pin(path string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.Calls = append(m.Calls, "pin "+path)
	if err := m.Fail[path]; err != nil {
		return fmt.Errorf("pinning %s: %w", path, err)
	}
	if m.pins == nil {
		m.pins = map[string]bool{}
	}
	m.pins[path] = true
	return nil
}

// Unpin implements Pinner.
func (m *Memory) Unpin(path string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.Calls = append(m.Calls, "unpin "+path)
	if err := m.Fail[path]; err != nil {
		return fmt.Errorf("releasing pin of %s: %w", path, err)
	}
	delete(m.pins, path)
	return nil
}

// Pinned implements Pinner.
func (m *Memory) Pinned(path string) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.pins[path], nil
}

// Paths returns the pinned paths.
func (m *Memory) Paths() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []string
	for p := range m.pins {
		out = append(out, p)
	}
	return out
}
