package podcerts

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
)

// KeyTypes are the key types the API allows in a projection.
var KeyTypes = []string{"RSA3072", "RSA4096", "ECDSAP256", "ECDSAP384", "ECDSAP521", "ED25519"}

// generateKey makes a private key of keyType and the stub PKCS#10 request
// the API server verifies as proof that the requester holds it (an empty
// subject, signed with the key).
func generateKey(keyType string) (crypto.Signer, []byte, error) {
	var key crypto.Signer
	var err error
	switch keyType {
	case "RSA3072":
		key, err = rsa.GenerateKey(rand.Reader, 3072)
	case "RSA4096":
		key, err = rsa.GenerateKey(rand.Reader, 4096)
	case "ECDSAP256":
		key, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	case "ECDSAP384":
		key, err = ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	case "ECDSAP521":
		key, err = ecdsa.GenerateKey(elliptic.P521(), rand.Reader)
	case "ED25519":
		_, key, err = ed25519.GenerateKey(rand.Reader)
	default:
		return nil, nil, fmt.Errorf("unknown key type %q (want one of %v)", keyType, KeyTypes)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("generating a %s key: %w", keyType, err)
	}
	csr, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, key)
	if err != nil {
		return nil, nil, fmt.Errorf("signing the stub PKCS#10 request: %w", err)
	}
	return key, csr, nil
}

// encodeKey is the key as the kubelet writes it: PKCS#8, PEM.
func encodeKey(key crypto.Signer) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

// cleanChain keeps only the certificates of a chain, re-encoded as bare
// CERTIFICATE blocks (no headers, nothing between blocks), and returns the
// leaf. The signer wrote the chain; the pod reads it.
func cleanChain(in []byte) ([]byte, *x509.Certificate, error) {
	var out bytes.Buffer
	var leaf *x509.Certificate
	rest := in
	for {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			break
		}
		if b.Type != "CERTIFICATE" {
			return nil, nil, fmt.Errorf("the certificate chain holds a %q block", b.Type)
		}
		if leaf == nil {
			c, err := x509.ParseCertificate(b.Bytes)
			if err != nil {
				return nil, nil, fmt.Errorf("the leaf certificate does not parse: %w", err)
			}
			leaf = c
		}
		_ = pem.Encode(&out, &pem.Block{Type: "CERTIFICATE", Bytes: b.Bytes})
	}
	if leaf == nil {
		return nil, nil, errors.New("the certificate chain holds no certificate")
	}
	return out.Bytes(), leaf, nil
}

// publicKeyOf is the public key of a PEM PKCS#8 private key.
func publicKeyOf(keyPEM []byte) (crypto.PublicKey, error) {
	b, _ := pem.Decode(keyPEM)
	if b == nil || b.Type != "PRIVATE KEY" {
		return nil, errors.New("no PKCS#8 private key")
	}
	k, err := x509.ParsePKCS8PrivateKey(b.Bytes)
	if err != nil {
		return nil, err
	}
	s, ok := k.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("unexpected key type %T", k)
	}
	return s.Public(), nil
}

// matches reports whether cert was issued to the public key pub.
func matches(cert *x509.Certificate, pub crypto.PublicKey) bool {
	e, ok := pub.(interface{ Equal(crypto.PublicKey) bool })
	return ok && e.Equal(cert.PublicKey)
}

// SplitBundle splits a credential bundle (the key's PEM block, then the
// chain's) into the two.
func SplitBundle(b []byte) (key, chain []byte) {
	blk, rest := pem.Decode(b)
	if blk == nil || blk.Type != "PRIVATE KEY" {
		return nil, nil
	}
	return pem.EncodeToMemory(blk), rest
}
