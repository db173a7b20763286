package manifest

import "testing"

// Which documents take the fast path; FuzzParse checks that the result is
// the decoder's whichever path a document takes.
func TestFastDecodeTakes(t *testing.T) {
	tests := []struct {
		name string
		doc  string
		want bool
	}{
		{"pod", `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p"}}`, true},
		{"kind first, spaces", " {\n \"kind\" : \"Pod\" ,\"apiVersion\":\"v1\",\"metadata\":{\"name\":\"p\"}}", true},
		{"storage group", `{"apiVersion":"storage.k8s.io/v1","kind":"CSIDriver","metadata":{"name":"d"}}`, true},
		{"as the YAML conversion writes it", `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"c","namespace":"n"}}`, true},
		{"metadata first", `{"metadata":{"name":"p"},"apiVersion":"v1","kind":"Pod"}`, false},
		{"escaped value", `{"apiVersion":"v\u0031","kind":"Pod"}`, false},
		{"same key twice", `{"kind":"Pod","kind":"Pod","metadata":{"name":"p"}}`, false},
		{"unsupported kind", `{"apiVersion":"v1","kind":"Node","metadata":{"name":"n"}}`, false},
		{"list", `{"apiVersion":"v1","kind":"List","items":[]}`, false},
		{"unknown field", `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p"},"extra":1}`, false},
		{"duplicate kind later", `{"apiVersion":"v1","kind":"Pod","kind":"Secret"}`, false},
		{"second document", `{"apiVersion":"v1","kind":"Pod"} {"apiVersion":"v1","kind":"Pod"}`, false},
		{"truncated", `{"apiVersion":"v1","kind":"Pod","metadata":{`, false},
		{"not an object", `["apiVersion","v1"]`, false},
		{"number value", `{"apiVersion":1,"kind":"Pod"}`, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := &parser{nodeName: "node-1"}
			if _, _, got := p.fastDecode([]byte(tt.doc)); got != tt.want {
				t.Errorf("fast path taken = %v, want %v", got, tt.want)
			}
			slow := &parser{nodeName: "node-1", decoderOnly: true}
			if _, _, got := slow.fastDecode([]byte(tt.doc)); got {
				t.Error("fast path taken with decoderOnly")
			}
		})
	}
}
