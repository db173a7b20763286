package csiclient_test

import (
	"errors"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"

	"github.com/volume-agent/volume-agent/csi/csiclient"
)

// wire builds protobuf bytes for the tests.
type wire []byte

func (w wire) varint(num protowire.Number, v uint64) wire {
	return protowire.AppendVarint(protowire.AppendTag(w, num, protowire.VarintType), v)
}

func (w wire) bytes(num protowire.Number, v []byte) wire {
	return protowire.AppendBytes(protowire.AppendTag(w, num, protowire.BytesType), v)
}

func (w wire) fixed32(num protowire.Number, v uint32) wire {
	return protowire.AppendFixed32(protowire.AppendTag(w, num, protowire.Fixed32Type), v)
}

func (w wire) group(num protowire.Number, body wire) wire {
	w = protowire.AppendTag(w, num, protowire.StartGroupType)
	w = append(w, body...)
	return protowire.AppendTag(w, num, protowire.EndGroupType)
}

func (w wire) raw(b ...byte) wire { return append(w, b...) }

func cond(abnormal bool, message string) *csiclient.VolumeCondition {
	return &csiclient.VolumeCondition{Abnormal: abnormal, Message: message}
}

var decodeCases = []struct {
	name string
	in   wire
	want *csiclient.VolumeCondition
	err  bool
}{
	{name: "no unknown fields", in: nil, want: nil},
	{name: "other unknown fields only", in: wire{}.varint(7, 1).bytes(9, []byte("x")), want: nil},
	{name: "empty condition", in: wire{}.bytes(2, nil), want: cond(false, "")},
	{name: "healthy with message", in: wire{}.bytes(2, wire{}.varint(1, 0).bytes(2, []byte("volume is healthy"))), want: cond(false, "volume is healthy")},
	{name: "abnormal", in: wire{}.bytes(2, wire{}.varint(1, 1).bytes(2, []byte("disk on fire"))), want: cond(true, "disk on fire")},
	{name: "any non-zero varint is true", in: wire{}.bytes(2, wire{}.varint(1, 1<<40)), want: cond(true, "")},
	{name: "occurrences merge, later values win", in: wire{}.bytes(2, wire{}.varint(1, 1).bytes(2, []byte("first"))).bytes(2, wire{}.bytes(2, []byte("second"))),
		want: cond(true, "second")},
	{name: "later abnormal=false wins", in: wire{}.bytes(2, wire{}.varint(1, 1)).bytes(2, wire{}.varint(1, 0)), want: cond(false, "")},
	{name: "unknown fields inside skipped", in: wire{}.bytes(2, wire{}.fixed32(5, 3).varint(1, 1).group(6, wire{}.varint(1, 2)).bytes(2, []byte("m"))),
		want: cond(true, "m")},
	{name: "abnormal of the wrong wire type is unknown", in: wire{}.bytes(2, wire{}.fixed32(1, 1)), want: cond(false, "")},
	{name: "message of the wrong wire type is unknown", in: wire{}.bytes(2, wire{}.varint(2, 1)), want: cond(false, "")},
	{name: "field 2 of the wrong wire type is unknown", in: wire{}.varint(2, 1), want: nil},
	{name: "field 2 as a group is unknown", in: wire{}.group(2, wire{}.varint(1, 1)), want: nil},
	{name: "usage (field 1) beside it is skipped", in: wire{}.bytes(1, wire{}.varint(1, 100).varint(4, 1)).bytes(2, wire{}.varint(1, 1)), want: cond(true, "")},
	{name: "UTF-8 message", in: wire{}.bytes(2, wire{}.bytes(2, []byte("Plattenfehler: ä ö ü 💥"))), want: cond(false, "Plattenfehler: ä ö ü 💥")},

	{name: "truncated tag", in: wire{}.raw(0x80), err: true},
	{name: "field number above the largest", in: wire(protowire.AppendTag(nil, protowire.MaxValidNumber+1, protowire.VarintType)).raw(0x00), err: true},
	{name: "field number above the largest inside", in: wire{}.bytes(2, wire(protowire.AppendTag(nil, protowire.MaxValidNumber+1, protowire.VarintType)).raw(0x00)), err: true},
	{name: "field number 0", in: wire{}.raw(0x00, 0x00), err: true},
	{name: "truncated length", in: wire{}.raw(0x12, 0x05, 0x08), err: true},
	{name: "truncated varint inside", in: wire{}.bytes(2, wire{}.raw(0x08, 0xff)), err: true},
	{name: "varint too long inside", in: wire{}.bytes(2, wire{}.raw(0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01)), err: true},
	{name: "message not UTF-8", in: wire{}.bytes(2, wire{}.bytes(2, []byte{0xff, 0xfe})), err: true},
	{name: "end group without start", in: protowire.AppendTag(nil, 3, protowire.EndGroupType), err: true},
	{name: "unterminated group", in: protowire.AppendTag(nil, 3, protowire.StartGroupType), err: true},
	{name: "malformed unknown field after a good condition", in: wire{}.bytes(2, wire{}.varint(1, 1)).raw(0x1a, 0x10), err: true},
}

func TestDecodeVolumeCondition(t *testing.T) {
	for _, c := range decodeCases {
		t.Run(c.name, func(t *testing.T) {
			got, err := csiclient.DecodeVolumeCondition(c.in)
			if c.err {
				if err == nil || !errors.Is(err, csiclient.ErrMalformedCondition) {
					t.Fatalf("got %+v, %v; want an ErrMalformedCondition", got, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if (got == nil) != (c.want == nil) || (got != nil && *got != *c.want) {
				t.Errorf("got %+v, want %+v", got, c.want)
			}
			// protobuf itself, with the schema of spec 1.12, agrees.
			if want, err := oracle(t, c.in); err != nil || (want == nil) != (got == nil) || (want != nil && *want != *got) {
				t.Errorf("protobuf with the old schema says %+v, %v", want, err)
			}
		})
	}
}

// A response of the generated (spec 1.13) type carrying the field, sent
// through marshal and unmarshal as gRPC does, keeps it among its unknown
// fields, next to the usage; AppendVolumeCondition writes what
// StatsVolumeCondition reads.
func TestVolumeConditionRoundTrip(t *testing.T) {
	for _, want := range []csiclient.VolumeCondition{{}, {Abnormal: true}, {Message: "ok"}, {Abnormal: true, Message: "read-only remount after I/O errors"}} {
		resp := &csi.NodeGetVolumeStatsResponse{Usage: []*csi.VolumeUsage{{Unit: csi.VolumeUsage_BYTES, Total: 100, Available: 60, Used: 40}}}
		resp.ProtoReflect().SetUnknown(csiclient.AppendVolumeCondition(nil, want))
		data, err := proto.Marshal(resp)
		if err != nil {
			t.Fatal(err)
		}
		var back csi.NodeGetVolumeStatsResponse
		if err := proto.Unmarshal(data, &back); err != nil {
			t.Fatal(err)
		}
		got, err := csiclient.StatsVolumeCondition(&back)
		if err != nil || got == nil || *got != want {
			t.Errorf("round trip of %+v: %+v, %v", want, got, err)
		}
		if u := back.GetUsage(); len(u) != 1 || u[0].GetTotal() != 100 {
			t.Errorf("usage lost: %v", u)
		}
	}
	if got, err := csiclient.StatsVolumeCondition(&csi.NodeGetVolumeStatsResponse{}); got != nil || err != nil {
		t.Errorf("response without a condition: %+v, %v", got, err)
	}
	if got, err := csiclient.StatsVolumeCondition(nil); got != nil || err != nil {
		t.Errorf("nil response: %+v, %v", got, err)
	}
}

// FuzzDecodeVolumeCondition checks the decoder against protobuf itself:
// for any bytes, DecodeVolumeCondition fails exactly when unmarshalling
// them into NodeGetVolumeStatsResponse of CSI spec 1.12 (built here from a
// descriptor) fails, and otherwise finds the same condition.
func FuzzDecodeVolumeCondition(f *testing.F) {
	for _, c := range decodeCases {
		f.Add([]byte(c.in))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		got, err := csiclient.DecodeVolumeCondition(data)
		want, oerr := oracle(t, data)
		if (err != nil) != (oerr != nil) {
			t.Fatalf("decoder error %v, protobuf error %v", err, oerr)
		}
		if err != nil {
			if !errors.Is(err, csiclient.ErrMalformedCondition) {
				t.Fatalf("error %v is not an ErrMalformedCondition", err)
			}
			return
		}
		if (got == nil) != (want == nil) || (got != nil && *got != *want) {
			t.Fatalf("decoder %+v, protobuf %+v", got, want)
		}
	})
}

// oldResponse is NodeGetVolumeStatsResponse as CSI spec 1.12 defines it,
// with only the field the decoder looks for (usage is unknown to it, as
// volume_condition is to the generated code).
var oldResponse = func() protoreflect.MessageDescriptor {
	opt := descriptorpb.FieldDescriptorProto_LABEL_OPTIONAL.Enum()
	fd := &descriptorpb.FileDescriptorProto{
		Name: proto.String("oldcsi.proto"), Package: proto.String("oldcsi"), Syntax: proto.String("proto3"),
		MessageType: []*descriptorpb.DescriptorProto{
			{Name: proto.String("VolumeCondition"), Field: []*descriptorpb.FieldDescriptorProto{
				{Name: proto.String("abnormal"), Number: proto.Int32(1), Label: opt, Type: descriptorpb.FieldDescriptorProto_TYPE_BOOL.Enum()},
				{Name: proto.String("message"), Number: proto.Int32(2), Label: opt, Type: descriptorpb.FieldDescriptorProto_TYPE_STRING.Enum()},
			}},
			{Name: proto.String("NodeGetVolumeStatsResponse"), Field: []*descriptorpb.FieldDescriptorProto{
				{Name: proto.String("volume_condition"), Number: proto.Int32(2), Label: opt,
					Type: descriptorpb.FieldDescriptorProto_TYPE_MESSAGE.Enum(), TypeName: proto.String(".oldcsi.VolumeCondition")},
			}},
		},
	}
	file, err := protodesc.NewFile(fd, nil)
	if err != nil {
		panic(err)
	}
	return file.Messages().ByName("NodeGetVolumeStatsResponse")
}()

// oracle unmarshals data with protobuf into the old response.
func oracle(t *testing.T, data []byte) (*csiclient.VolumeCondition, error) {
	t.Helper()
	msg := dynamicpb.NewMessage(oldResponse)
	if err := proto.Unmarshal(data, msg); err != nil {
		return nil, err
	}
	field := oldResponse.Fields().ByNumber(2)
	if !msg.Has(field) {
		return nil, nil
	}
	c := msg.Get(field).Message()
	fields := c.Descriptor().Fields()
	return &csiclient.VolumeCondition{Abnormal: c.Get(fields.ByNumber(1)).Bool(), Message: c.Get(fields.ByNumber(2)).String()}, nil
}
