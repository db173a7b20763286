package manifest

import (
	"bytes"
	"encoding/json"
	"math"
	"slices"
	"strings"
	"sync"
	"unsafe"

	corev1 "k8s.io/api/core/v1"
)

// fastYAMLToJSON converts the plain YAML that tools and people write for
// pod manifests (block and flow mappings and sequences, plain and quoted
// one-line scalars) to the JSON sigs.k8s.io/yaml would produce, in one pass
// and a fraction of the allocations: the YAML library tokenises, builds a
// tree, decodes it into maps and marshals them again, a sixth of a storm's
// CPU. Anything else (anchors, tags, block or multi-line scalars, tabs,
// non-ASCII bytes, duplicate keys, a plain scalar that YAML 1.1 would read
// as anything but a string, an integer or true/false/null) answers ok false,
// and the caller converts with the YAML library, which also gives the
// errors and warnings. Keys come out sorted, as json.Marshal sorts a map's.
//
// The JSON is appended to dst, so the caller can reuse one buffer.
func fastYAMLToJSON(dst, doc []byte) (js []byte, ok bool) {
	js, _, ok = fastYAMLToJSONHint(dst, doc)
	return js, ok
}

// fastYAMLToJSONHint is fastYAMLToJSON that also reads the slice sizes
// of a pod off the tree, for decoding.
func fastYAMLToJSONHint(dst, doc []byte) (js []byte, hint sliceHint, ok bool) {
	js, _, hint, ok = fastYAMLToPod(dst, doc, false)
	return js, hint, ok
}

// fastYAMLToPod is fastYAMLToJSONHint that, with direct, decodes a pod
// straight from the tree where decodePodTree can, and then writes no JSON.
func fastYAMLToPod(dst, doc []byte, direct bool) (js []byte, pod *corev1.Pod, hint sliceHint, ok bool) {
	for _, c := range doc {
		if c >= 0x7f || (c < 0x20 && c != '\n') {
			return nil, nil, hint, false
		}
	}
	if len(doc) > math.MaxInt32 {
		return nil, nil, hint, false
	}
	p := scanners.Get().(*yamlScanner)
	defer p.release()
	p.s = doc
	if !p.skipBlank() {
		return nil, nil, hint, false
	}
	if p.i == len(p.s) {
		return append(dst, "null"...), nil, hint, true
	}
	n, ok := p.blockNode(p.col(), 0)
	if !ok || !p.skipBlank() || p.i != len(p.s) {
		return nil, nil, hint, false
	}
	if direct {
		if pod, ok := p.decodePodTree(&n); ok {
			return nil, pod, hint, true
		}
	}
	return p.appendJSON(slices.Grow(dst, len(doc)), &n), nil, p.hintOf(&n), true
}

// sliceHint holds the lengths of spec.volumes and spec.containers of a
// document that may be a pod, where they are sequences with items (0:
// absent, empty or not known): decoding then allocates each slice at its
// size instead of growing it (a third of the allocations v2 makes for a
// pod). A missing key must still decode as nil, so only a key that is
// there gets a slice.
type sliceHint struct{ volumes, containers int }

func (p *yamlScanner) hintOf(n *yamlNode) sliceHint {
	spec := p.get(n, "spec")
	return sliceHint{volumes: p.get(spec, "volumes").seqLen(), containers: p.get(spec, "containers").seqLen()}
}

// presize gives a pod about to be decoded slices of the sizes h says.
// Decoding overwrites them, as the key is in the document.
func (h sliceHint) presize(pod *corev1.Pod) {
	if h.volumes > 0 {
		pod.Spec.Volumes = make([]corev1.Volume, 0, h.volumes)
	}
	if h.containers > 0 {
		pod.Spec.Containers = make([]corev1.Container, 0, h.containers)
	}
}

// get returns the value of key in a mapping, nil if n is nil, not a
// mapping or has no such key.
func (p *yamlScanner) get(n *yamlNode, key string) *yamlNode {
	if n == nil || n.kind != yamlMap {
		return nil
	}
	entries := p.entries(n)
	if i, found := slices.BinarySearchFunc(entries, key, func(e yamlEntry, key string) int {
		return strings.Compare(p.str(&e.key), key)
	}); found {
		return &entries[i].node
	}
	return nil
}

func (n *yamlNode) seqLen() int {
	if n == nil || n.kind != yamlSeq {
		return 0
	}
	return int(n.n)
}

// maxYAMLDepth bounds nesting; deeper documents take the library's path.
const maxYAMLDepth = 64

// maxSimpleKey is how far a key's colon may be from its start: YAML
// allows an implicit key 1024 characters; longer ones are the library's
// error to report.
const maxSimpleKey = 1000

type yamlKind uint8

const (
	yamlNull yamlKind = iota
	yamlString
	yamlNumber // an integer, as written (no sign but '-', no leading zero)
	yamlTrue
	yamlFalse
	yamlMap
	yamlSeq
)

// yamlNode holds no pointers but offsets into its scanner, so building
// a tree costs no write barriers and its memory no GC scanning: with
// strings and slices in the nodes, barriers and clearing them took a
// third of the conversion while the GC was marking, as in a storm.
type yamlNode struct {
	kind yamlKind
	// quoted says the text is in the scanner's unq, not the document.
	quoted bool
	// off and n are where the text of a yamlString or yamlNumber starts
	// and its length, or where the entries of a yamlMap or yamlSeq start
	// in the scanner's nodes and how many there are (a mapping's sorted by
	// key). One pair for both keeps a node at 12 bytes: copies of an odd
	// 20 bytes were slow stores and loads, much of the scanner's time.
	off, n int32
}

// yamlEntry is an entry of a collection: a mapping's key (a yamlString)
// and value, or a sequence's item (the key is zero).
type yamlEntry struct {
	key, node yamlNode
}

// str is the text of n, sharing the document's or the scanner's memory:
// valid until the scanner is released.
func (p *yamlScanner) str(n *yamlNode) string {
	if n.quoted {
		if n.n == 0 {
			return ""
		}
		return unsafe.String(&p.unq[n.off], n.n)
	}
	return p.text(int(n.off), int(n.off+n.n))
}

func (p *yamlScanner) entries(n *yamlNode) []yamlEntry {
	return p.nodes[n.off : n.off+n.n]
}

func (p *yamlScanner) appendJSON(b []byte, n *yamlNode) []byte {
	switch n.kind {
	case yamlNull:
		b = append(b, "null"...)
	case yamlTrue:
		b = append(b, "true"...)
	case yamlFalse:
		b = append(b, "false"...)
	case yamlNumber:
		b = append(b, p.str(n)...)
	case yamlString:
		b = appendJSONString(b, p.str(n))
	case yamlSeq:
		b = append(b, '[')
		for i := range p.entries(n) {
			if i > 0 {
				b = append(b, ',')
			}
			b = p.appendJSON(b, &p.nodes[int(n.off)+i].node)
		}
		b = append(b, ']')
	case yamlMap:
		// Keys are sorted (collection sorts them).
		b = append(b, '{')
		for i := range p.entries(n) {
			if i > 0 {
				b = append(b, ',')
			}
			e := &p.nodes[int(n.off)+i]
			b = appendJSONString(b, p.str(&e.key))
			b = append(b, ':')
			b = p.appendJSON(b, &e.node)
		}
		b = append(b, '}')
	}
	return b
}

// appendJSONString appends s (printable ASCII: fastYAMLToJSON admits
// nothing else) as a JSON string.
func appendJSONString(b []byte, s string) []byte {
	for i := range len(s) {
		if s[i] == '"' || s[i] == '\\' {
			q, _ := json.Marshal(s)
			return append(b, q...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}

// yamlScanner reads one document. i is the offset, line the offset where
// the current line starts.
type yamlScanner struct {
	s    []byte
	i    int
	line int
	// stack holds the entries of the collections being read: a
	// collection pushes its entries above those of the ones around it and,
	// once complete, moves them to nodes, where they stay together.
	stack []yamlEntry
	// nodes holds the entries of completed collections; the tree lives no
	// longer than the document, so one slice serves all of it.
	nodes []yamlEntry
	// unq holds the text of quoted scalars, without quotes and escapes.
	unq []byte
}

// scanners keeps scanners with their slices between documents: the tree
// of one is dead once its JSON is written, so the next can use the same
// memory and a pod costs no allocation for it.
var scanners = sync.Pool{New: func() any { return new(yamlScanner) }}

// maxKeptEntries bounds the entries a pooled scanner keeps, so a huge
// document does not pin its memory.
const maxKeptEntries = 4096

// release returns the scanner to the pool. Nothing in it points into the
// document but s, so nothing needs clearing.
func (p *yamlScanner) release() {
	if cap(p.stack) > maxKeptEntries || cap(p.nodes) > maxKeptEntries || cap(p.unq) > maxKeptEntries*16 {
		return
	}
	*p = yamlScanner{stack: p.stack[:0], nodes: p.nodes[:0], unq: p.unq[:0]}
	scanners.Put(p)
}

// text is the document's bytes from start to end as a string that shares
// its memory: the tree built from it lives only until fastYAMLToJSON has
// written its JSON, and the document is not written meanwhile.
func (p *yamlScanner) text(start, end int) string {
	if start == end {
		return ""
	}
	return unsafe.String(&p.s[start], end-start)
}

// plain is a yamlString or yamlNumber node of the document's bytes from
// start to end.
func plain(kind yamlKind, start, end int) yamlNode {
	return yamlNode{kind: kind, off: int32(start), n: int32(end - start)}
}

// collection moves the entries pushed since base out of the stack into
// n. A mapping's entries are sorted by key, the order json.Marshal writes
// a map's in; ok is false if a key is there twice.
func (p *yamlScanner) collection(n *yamlNode, base int) (ok bool) {
	entries := p.stack[base:]
	if n.kind == yamlMap {
		// Insertion sort: keys are few. A key stops next to the largest
		// key before it that is not greater, which is its duplicate if
		// it has one, so the sort also finds duplicates.
		for i := 1; i < len(entries); i++ {
			k := p.str(&entries[i].key)
			j := i
			for ; j > 0; j-- {
				c := strings.Compare(k, p.str(&entries[j-1].key))
				if c == 0 {
					return false
				}
				if c > 0 {
					break
				}
			}
			if j < i {
				e := entries[i]
				copy(entries[j+1:i+1], entries[j:i])
				entries[j] = e
			}
		}
	}
	n.off, n.n = int32(len(p.nodes)), int32(len(entries))
	p.nodes = append(p.nodes, entries...)
	p.stack = p.stack[:base]
	return true
}

func (p *yamlScanner) col() int { return p.i - p.line }

// skipBlank skips spaces, comments and line ends. It fails on what this
// subset leaves to the library: directives and "..." at the start of a
// line.
func (p *yamlScanner) skipBlank() bool {
	for p.i < len(p.s) {
		switch c := p.s[p.i]; {
		case c == ' ':
			p.i++
		case c == '\n':
			p.i++
			p.line = p.i
		case c == '#' && (p.i == p.line || p.s[p.i-1] == ' '):
			for p.i < len(p.s) && p.s[p.i] != '\n' {
				p.i++
			}
		default:
			if p.i == p.line && (c == '%' || bytes.HasPrefix(p.s[p.i:], []byte("..."))) {
				return false
			}
			return true
		}
	}
	return true
}

// restOfLineEmpty skips spaces and a comment up to the end of the line and
// reports whether the line ended (or the document).
func (p *yamlScanner) restOfLineEmpty() bool {
	for p.i < len(p.s) && p.s[p.i] == ' ' {
		p.i++
	}
	if p.i > 0 && p.i < len(p.s) && p.s[p.i] == '#' && p.s[p.i-1] == ' ' {
		for p.i < len(p.s) && p.s[p.i] != '\n' {
			p.i++
		}
	}
	return p.i == len(p.s) || p.s[p.i] == '\n'
}

func (p *yamlScanner) at(c byte) bool { return p.i < len(p.s) && p.s[p.i] == c }

// seqDash reports whether a block sequence entry starts here: "-" followed
// by a space, a line end or the end.
func (p *yamlScanner) seqDash() bool {
	return p.at('-') && (p.i+1 == len(p.s) || p.s[p.i+1] == ' ' || p.s[p.i+1] == '\n')
}

// blockNode reads the node starting at the current position, which is at
// column indent, in block context.
func (p *yamlScanner) blockNode(indent, depth int) (yamlNode, bool) {
	if depth > maxYAMLDepth {
		return yamlNode{}, false
	}
	if p.seqDash() {
		return p.blockSeq(indent, depth)
	}
	if p.at('{') || p.at('[') {
		n, ok := p.flowNode(depth)
		return n, ok && p.restOfLineEmpty()
	}
	// A scalar, or the first key of a mapping.
	k, isKey, ok := p.key()
	if !ok {
		return yamlNode{}, false
	}
	if isKey {
		return p.blockMap(k, indent, depth)
	}
	n, ok := p.scalar(false)
	return n, ok && p.restOfLineEmpty()
}

// key reads a mapping key ("name:" followed by a space or line end) if one
// starts here, leaving the position after the colon.
func (p *yamlScanner) key() (key yamlNode, isKey, ok bool) {
	start := p.i
	switch {
	case p.at('"') || p.at('\''):
		s, ok := p.quoted()
		if !ok {
			return yamlNode{}, false, false
		}
		for p.at(' ') {
			p.i++
		}
		if p.at(':') && (p.i+1 == len(p.s) || p.s[p.i+1] == ' ' || p.s[p.i+1] == '\n') {
			if p.i-start > maxSimpleKey {
				return yamlNode{}, false, false
			}
			p.i++
			return s, true, true
		}
		p.i = start
		return yamlNode{}, false, true
	default:
		end := p.i
		for end < len(p.s) && p.s[end] != '\n' {
			if p.s[end] == ':' && (end+1 == len(p.s) || p.s[end+1] == ' ' || p.s[end+1] == '\n') {
				// The loop stopped at the first ": " and before any " #",
				// so only a trailing ':' is left for yamlPlainString's pass.
				k := strings.TrimRight(p.text(p.i, end), " ")
				if end-p.i > maxSimpleKey || !plainScanned(k) || k[len(k)-1] == ':' {
					return yamlNode{}, false, false
				}
				n := plain(yamlString, p.i, p.i+len(k))
				p.i = end + 1
				return n, true, true
			}
			if p.s[end] == '#' && end > p.i && p.s[end-1] == ' ' {
				break
			}
			end++
		}
		return yamlNode{}, false, true
	}
}

// blockMap reads a block mapping whose first key, k, has just been read.
func (p *yamlScanner) blockMap(k yamlNode, indent, depth int) (yamlNode, bool) {
	n := yamlNode{kind: yamlMap}
	base := len(p.stack)
	for {
		v, ok := p.mapValue(indent, depth)
		if !ok {
			return yamlNode{}, false
		}
		p.stack = append(p.stack, yamlEntry{key: k, node: v})
		if !p.skipBlank() {
			return yamlNode{}, false
		}
		switch c := p.col(); {
		case p.i == len(p.s) || c < indent:
			return n, p.collection(&n, base)
		case c > indent || p.seqDash():
			return yamlNode{}, false
		}
		var isKey bool
		if k, isKey, ok = p.key(); !ok || !isKey {
			return yamlNode{}, false
		}
	}
}

// mapValue reads the value after a key's colon: on the same line, or below
// it, indented more than the key or (a sequence) as much.
func (p *yamlScanner) mapValue(indent, depth int) (yamlNode, bool) {
	if !p.restOfLineEmpty() {
		n, ok := p.inlineValue(depth)
		if !ok || !p.restOfLineEmpty() {
			return yamlNode{}, false
		}
		// A plain scalar continued on the next line is a multi-line
		// scalar: left to the library. The caller skips the blanks next,
		// so the look-ahead keeps its place rather than reading them twice.
		if !p.skipBlank() {
			return yamlNode{}, false
		}
		if p.i < len(p.s) && p.col() > indent {
			return yamlNode{}, false
		}
		return n, true
	}
	if !p.skipBlank() {
		return yamlNode{}, false
	}
	switch c := p.col(); {
	case p.i < len(p.s) && c > indent:
		return p.blockNode(c, depth+1)
	case p.i < len(p.s) && c == indent && p.seqDash():
		return p.blockSeq(c, depth+1)
	}
	return yamlNode{kind: yamlNull}, true
}

// inlineValue reads a value that starts on the current line: a flow
// collection or a scalar. A mapping cannot start there ("a: b: c").
func (p *yamlScanner) inlineValue(depth int) (yamlNode, bool) {
	if p.at('{') || p.at('[') {
		return p.flowNode(depth + 1)
	}
	if p.seqDash() {
		return yamlNode{}, false
	}
	return p.scalar(false)
}

func (p *yamlScanner) blockSeq(indent, depth int) (yamlNode, bool) {
	n := yamlNode{kind: yamlSeq}
	base := len(p.stack)
	for {
		if !p.seqDash() {
			return yamlNode{}, false
		}
		p.i++
		var item yamlNode
		if p.restOfLineEmpty() {
			if !p.skipBlank() {
				return yamlNode{}, false
			}
			if c := p.col(); p.i < len(p.s) && c > indent {
				var ok bool
				if item, ok = p.blockNode(c, depth+1); !ok {
					return yamlNode{}, false
				}
			} else {
				item = yamlNode{kind: yamlNull}
			}
		} else {
			var ok bool
			if item, ok = p.blockNode(p.col(), depth+1); !ok {
				return yamlNode{}, false
			}
		}
		p.stack = append(p.stack, yamlEntry{node: item})
		if !p.skipBlank() {
			return yamlNode{}, false
		}
		// A line at the sequence's column that is no entry ends it: the
		// sequence was a mapping's value, at its key's column.
		switch c := p.col(); {
		case p.i == len(p.s) || c < indent || (c == indent && !p.seqDash()):
			return n, p.collection(&n, base)
		case c > indent:
			return yamlNode{}, false
		}
	}
}

// flowNode reads a flow mapping or sequence, which may span lines.
func (p *yamlScanner) flowNode(depth int) (yamlNode, bool) {
	if depth > maxYAMLDepth {
		return yamlNode{}, false
	}
	closer := byte(']')
	n := yamlNode{kind: yamlSeq}
	if p.at('{') {
		closer, n.kind = '}', yamlMap
	}
	p.i++
	base := len(p.stack)
	for first := true; ; first = false {
		if !p.skipBlank() || p.i == len(p.s) {
			return yamlNode{}, false
		}
		if p.at(closer) {
			if !first && n.kind == yamlSeq && len(p.stack) == base {
				return yamlNode{}, false
			}
			p.i++
			return n, p.collection(&n, base)
		}
		if !first {
			// "," then an entry; a trailing comma is left to the library.
			if !p.at(',') {
				return yamlNode{}, false
			}
			p.i++
			if !p.skipBlank() || p.i == len(p.s) || p.at(closer) || p.at(',') {
				return yamlNode{}, false
			}
		}
		if n.kind == yamlMap {
			var k yamlNode
			keyStart := p.i
			switch {
			case p.at('"') || p.at('\''):
				s, ok := p.quoted()
				if !ok {
					return yamlNode{}, false
				}
				k = s
			default:
				start := p.i
				for p.i < len(p.s) && !flowKeyEnd[p.s[p.i]] {
					p.i++
				}
				// flowKeyEnd stopped at all yamlPlainString's pass looks for.
				ks := strings.TrimRight(p.text(start, p.i), " ")
				if !plainScanned(ks) {
					return yamlNode{}, false
				}
				k = plain(yamlString, start, start+len(ks))
			}
			for p.at(' ') {
				p.i++
			}
			if !p.at(':') || p.i+1 == len(p.s) || p.s[p.i+1] != ' ' || p.i-keyStart > maxSimpleKey {
				return yamlNode{}, false
			}
			p.i++
			if !p.skipBlank() || p.i == len(p.s) || p.at(',') || p.at('}') {
				return yamlNode{}, false // "{a: }": null values left to the library
			}
			v, ok := p.flowValue(depth)
			if !ok {
				return yamlNode{}, false
			}
			p.stack = append(p.stack, yamlEntry{key: k, node: v})
			continue
		}
		v, ok := p.flowValue(depth)
		if !ok {
			return yamlNode{}, false
		}
		p.stack = append(p.stack, yamlEntry{node: v})
	}
}

func (p *yamlScanner) flowValue(depth int) (yamlNode, bool) {
	if p.at('{') || p.at('[') {
		return p.flowNode(depth + 1)
	}
	return p.scalar(true)
}

// scalar reads a quoted or plain scalar on the current line. In flow
// context a plain one ends at ",", "]" or "}" too.
func (p *yamlScanner) scalar(flow bool) (yamlNode, bool) {
	if p.at('"') || p.at('\'') {
		return p.quoted()
	}
	start, end := p.i, p.i
	for p.i < len(p.s) {
		c := p.s[p.i]
		if c == '\n' || (c == '#' && p.i > start && p.s[p.i-1] == ' ') {
			break
		}
		if c == ':' && (p.i+1 == len(p.s) || p.s[p.i+1] == ' ' || p.s[p.i+1] == '\n') {
			return yamlNode{}, false // a key where a value belongs
		}
		if flow && (c == ',' || c == ']' || c == '}') {
			break
		}
		if flow && (c == '[' || c == '{' || c == ':') {
			return yamlNode{}, false
		}
		p.i++
		if c != ' ' {
			end = p.i
		}
	}
	// The loop refused or stopped at all yamlPlainString's pass looks
	// for: " #", ": ", a trailing ':' and, in flow context, indicators.
	s := p.text(start, end)
	switch {
	case s == "":
		return yamlNode{}, false
	case s == "null" || s == "Null" || s == "NULL" || s == "~":
		return yamlNode{kind: yamlNull}, true
	case s == "true" || s == "True" || s == "TRUE":
		return yamlNode{kind: yamlTrue}, true
	case s == "false" || s == "False" || s == "FALSE":
		return yamlNode{kind: yamlFalse}, true
	case plainInteger(s):
		return plain(yamlNumber, start, start+len(s)), true
	case plainScanned(s):
		return plain(yamlString, start, start+len(s)), true
	}
	return yamlNode{}, false
}

// quoted reads a one-line single- or double-quoted scalar into unq.
// Double-quoted escapes other than \" and \\ are left to the library.
func (p *yamlScanner) quoted() (yamlNode, bool) {
	q := p.s[p.i]
	p.i++
	n := yamlNode{kind: yamlString, quoted: true, off: int32(len(p.unq))}
	for p.i < len(p.s) {
		c := p.s[p.i]
		switch {
		case c == '\n':
			return yamlNode{}, false
		case c == q && q == '\'' && p.i+1 < len(p.s) && p.s[p.i+1] == '\'':
			p.unq = append(p.unq, '\'')
			p.i += 2
		case c == q:
			p.i++
			n.n = int32(len(p.unq)) - n.off
			return n, true
		case c == '\\' && q == '"':
			if p.i+1 == len(p.s) || (p.s[p.i+1] != '"' && p.s[p.i+1] != '\\') {
				return yamlNode{}, false
			}
			p.unq = append(p.unq, p.s[p.i+1])
			p.i += 2
		default:
			p.unq = append(p.unq, c)
			p.i++
		}
	}
	return yamlNode{}, false
}

// plainInteger reports whether s is a decimal integer that YAML 1.1 and
// JSON read alike: no sign but "-", no leading zero (YAML 1.1 octal), no
// "_", and small enough for an int64.
func plainInteger(s string) bool {
	d := strings.TrimPrefix(s, "-")
	if d == "" || len(d) > 18 || (d[0] == '0' && (len(d) > 1 || s != d)) {
		return false
	}
	for i := 0; i < len(d); i++ {
		if d[i] < '0' || d[i] > '9' {
			return false
		}
	}
	return true
}

// yaml11Words are the plain scalars YAML 1.1 reads as booleans, null or
// special floats, beside those scalar handles; none is longer than five
// bytes and few letters start one (yaml11First), which spares most strings
// the lookup.
var yaml11Words = map[string]bool{
	"y": true, "Y": true, "yes": true, "Yes": true, "YES": true,
	"n": true, "N": true, "no": true, "No": true, "NO": true,
	"on": true, "On": true, "ON": true, "off": true, "Off": true, "OFF": true,
	"true": true, "True": true, "TRUE": true, "false": true, "False": true, "FALSE": true,
	"null": true, "Null": true, "NULL": true,
}

// isYAML11Word is yaml11Words[s] without hashing s (FuzzYAMLPlainString
// compares the two).
func isYAML11Word(s string) bool {
	switch s {
	case "y", "Y", "yes", "Yes", "YES",
		"n", "N", "no", "No", "NO",
		"on", "On", "ON", "off", "Off", "OFF",
		"true", "True", "TRUE", "false", "False", "FALSE",
		"null", "Null", "NULL":
		return true
	}
	return false
}

// byteSet is a set of bytes, for tests per character on the hot path.
type byteSet [256]bool

func newByteSet(chars string) *byteSet {
	var set byteSet
	for i := range len(chars) {
		set[chars[i]] = true
	}
	return &set
}

var (
	// notPlainStart are the first characters yamlPlainString refuses.
	notPlainStart = newByteSet("-?:,[]{}#&*!|>'\"%@`+.0123456789~< ")
	// flowKeyEnd end a plain key in a flow mapping.
	flowKeyEnd = newByteSet(":,[]{}#\n")
	// yaml11First are the first bytes of yaml11Words.
	yaml11First = func() *byteSet {
		var first []byte
		for w := range yaml11Words {
			first = append(first, w[0])
		}
		return newByteSet(string(first))
	}()
)

// yamlPlainString reports whether the plain scalar s is certainly read as the
// string s: it does not start with an indicator or a character that could
// begin a number, timestamp, special float, null or merge key, is not one of
// YAML 1.1's boolean or null words, and (in flow context) holds no flow
// indicator.
func yamlPlainString(s string, flow bool) bool {
	if quantityLike(s) {
		return true
	}
	if !plainScanned(s) {
		return false
	}
	// One pass for " #", ": " and (in flow context) flow indicators; none
	// can be at s[0], which notPlainStart refused.
	for i := 1; i < len(s); i++ {
		switch s[i] {
		case '#':
			if s[i-1] == ' ' {
				return false
			}
		case ':':
			if i+1 == len(s) || s[i+1] == ' ' {
				return false // also a trailing ":"
			}
		case ',', '[', ']', '{', '}':
			if flow {
				return false
			}
		}
	}
	return true
}

// plainScanned is yamlPlainString without its pass over s, for a scanner
// that has already refused, on its way to s's end, what the pass looks
// for (FuzzYAMLPlainString compares the two on such strings).
func plainScanned(s string) bool {
	return quantityLike(s) || (s != "" && !notPlainStart[s[0]] && !(len(s) <= 5 && yaml11First[s[0]] && isYAML11Word(s)))
}

// quantityLike reports whether s is a string that starts with a digit but
// that YAML 1.1 cannot read as anything else ("1Mi", "500m"): a digit 1-9
// first (base prefixes start with 0), then only letters and digits with a
// letter other than e or E among them (no float, and no timestamp, which
// needs a '-').
func quantityLike(s string) bool {
	if s == "" || s[0] < '1' || s[0] > '9' {
		return false
	}
	letter := false
	for i := 1; i < len(s); i++ {
		switch c := s[i]; {
		case c >= '0' && c <= '9':
		case (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'):
			letter = letter || (c != 'e' && c != 'E')
		default:
			return false
		}
	}
	return letter
}
