package plugins

import (
	"encoding/json"
	"sort"
)

// sourceKind returns the name of the (first) set field of a volume source
// struct, e.g. "nfs", the way it is spelled in a manifest.
func sourceKind(src any) string {
	raw, err := json.Marshal(src)
	if err != nil {
		return "unknown"
	}
	var fields map[string]json.RawMessage
	if json.Unmarshal(raw, &fields) != nil || len(fields) == 0 {
		return "empty"
	}
	keys := make([]string, 0, len(fields))
	for k := range fields {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys[0]
}
