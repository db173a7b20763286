package csiclient

import (
	"errors"
	"fmt"
	"unicode/utf8"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/protobuf/encoding/protowire"
)

// VolumeCondition is a driver's word on a volume's health, from
// NodeGetVolumeStatsResponse.volume_condition (CSI spec 1.3 to 1.12):
//
//	message VolumeCondition { bool abnormal = 1; string message = 2; }
//
// Spec 1.13, which go.mod has, removed the field (number 2 is reserved), so
// the generated code keeps it among the response's unknown fields; drivers
// built with an older spec still send it and the kubelet still reads it.
type VolumeCondition struct {
	Abnormal bool
	Message  string
}

// Field numbers of the removed messages.
const (
	statsResponseConditionField protowire.Number = 2
	conditionAbnormalField      protowire.Number = 1
	conditionMessageField       protowire.Number = 2
)

// ErrMalformedCondition is returned (wrapped) for bytes protobuf would
// refuse to decode.
var ErrMalformedCondition = errors.New("malformed volume_condition")

// StatsVolumeCondition returns the volume condition of a
// NodeGetVolumeStats response: nil (and no error) when the driver sent
// none.
func StatsVolumeCondition(resp *csi.NodeGetVolumeStatsResponse) (*VolumeCondition, error) {
	if resp == nil {
		return nil, nil
	}
	return DecodeVolumeCondition(resp.ProtoReflect().GetUnknown())
}

// DecodeVolumeCondition finds field 2 (volume_condition) in the unknown
// fields of a NodeGetVolumeStatsResponse and decodes it as protobuf does:
// occurrences of the field merge (a later value of abnormal or message
// wins), fields it does not know and known fields of an unexpected wire
// type are skipped, and anything protobuf would refuse to unmarshal (a
// truncated or malformed field, a message that is not UTF-8) is an error.
// It returns nil when the field is absent.
func DecodeVolumeCondition(unknown []byte) (*VolumeCondition, error) {
	var cond *VolumeCondition
	for b := unknown; len(b) > 0; {
		num, typ, n, err := consumeTag(b)
		if err != nil {
			return nil, malformed("NodeGetVolumeStatsResponse", err)
		}
		b = b[n:]
		if num == statsResponseConditionField && typ == protowire.BytesType {
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return nil, malformed("NodeGetVolumeStatsResponse.volume_condition", protowire.ParseError(n))
			}
			if cond == nil {
				cond = &VolumeCondition{}
			}
			if err := cond.merge(v); err != nil {
				return nil, err
			}
			b = b[n:]
			continue
		}
		n = protowire.ConsumeFieldValue(num, typ, b)
		if n < 0 {
			return nil, malformed(fmt.Sprintf("NodeGetVolumeStatsResponse field %d", num), protowire.ParseError(n))
		}
		b = b[n:]
	}
	return cond, nil
}

// merge decodes one encoded VolumeCondition over c.
func (c *VolumeCondition) merge(b []byte) error {
	for len(b) > 0 {
		num, typ, n, err := consumeTag(b)
		if err != nil {
			return malformed("VolumeCondition", err)
		}
		b = b[n:]
		switch {
		case num == conditionAbnormalField && typ == protowire.VarintType:
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return malformed("VolumeCondition.abnormal", protowire.ParseError(n))
			}
			c.Abnormal = protowire.DecodeBool(v)
			b = b[n:]
		case num == conditionMessageField && typ == protowire.BytesType:
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return malformed("VolumeCondition.message", protowire.ParseError(n))
			}
			// proto3 strings must be UTF-8: protobuf refuses the
			// whole response otherwise, and so does the kubelet.
			if !utf8.Valid(v) {
				return malformed("VolumeCondition.message", errors.New("not valid UTF-8"))
			}
			c.Message = string(v)
			b = b[n:]
		default:
			n = protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return malformed(fmt.Sprintf("VolumeCondition field %d", num), protowire.ParseError(n))
			}
			b = b[n:]
		}
	}
	return nil
}

// consumeTag is protowire.ConsumeTag refusing field numbers above the
// largest valid one, as protobuf's unmarshal does (ConsumeTag checks only
// the lower bound).
func consumeTag(b []byte) (protowire.Number, protowire.Type, int, error) {
	num, typ, n := protowire.ConsumeTag(b)
	if n < 0 {
		return 0, 0, n, protowire.ParseError(n)
	}
	if num > protowire.MaxValidNumber {
		return 0, 0, -1, fmt.Errorf("invalid field number %d", num)
	}
	return num, typ, n, nil
}

func malformed(where string, err error) error {
	return fmt.Errorf("%w: %s: %v", ErrMalformedCondition, where, err)
}

// AppendVolumeCondition appends c encoded as field 2 of a
// NodeGetVolumeStatsResponse: what a driver built with CSI spec 1.12 sends.
// Drivers (the test driver) set it as the response's unknown fields.
func AppendVolumeCondition(b []byte, c VolumeCondition) []byte {
	var inner []byte
	if c.Abnormal {
		inner = protowire.AppendTag(inner, conditionAbnormalField, protowire.VarintType)
		inner = protowire.AppendVarint(inner, protowire.EncodeBool(true))
	}
	if c.Message != "" {
		inner = protowire.AppendTag(inner, conditionMessageField, protowire.BytesType)
		inner = protowire.AppendString(inner, c.Message)
	}
	b = protowire.AppendTag(b, statsResponseConditionField, protowire.BytesType)
	return protowire.AppendBytes(b, inner)
}
