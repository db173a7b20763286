package cluster

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// pki holds the file names of the credentials generated for one cluster.
type pki struct {
	caCert, servingCert, servingKey string // TLS for the apiserver; clients trust caCert
	caKey                           string // signs node certificates (Options.NodeCertificates)
	saKey, saPub                    string // service-account token signing key pair
	tokens                          string // static token file for --token-auth-file
	caPEM                           []byte
}

// staticUser is a line of the static token file.
type staticUser struct {
	token, name string
	groups      []string
}

// writePKI creates a CA, an apiserver serving certificate for 127.0.0.1 and
// localhost (so clients verify TLS instead of skipping it), the
// service-account key pair and the static token file.
func writePKI(dir string, users []staticUser) (*pki, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	p := &pki{
		caCert:      filepath.Join(dir, "ca.crt"),
		caKey:       filepath.Join(dir, "ca.key"),
		servingCert: filepath.Join(dir, "apiserver.crt"),
		servingKey:  filepath.Join(dir, "apiserver.key"),
		saKey:       filepath.Join(dir, "sa.key"),
		saPub:       filepath.Join(dir, "sa.pub"),
		tokens:      filepath.Join(dir, "tokens.csv"),
	}

	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "volume-agent-test-ca"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(10 * 365 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, caKey.Public(), caKey)
	if err != nil {
		return nil, err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, err
	}
	servingKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	servingDER, err := x509.CreateCertificate(rand.Reader, &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "kube-apiserver"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(10 * 365 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		DNSNames:     []string{"localhost"},
	}, ca, servingKey.Public(), caKey)
	if err != nil {
		return nil, err
	}
	// RSA because it is what every consumer of service-account tokens supports.
	saKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return nil, err
	}

	p.caPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})
	servingPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: servingDER})
	files := []struct {
		path string
		data func() ([]byte, error)
	}{
		{p.caCert, func() ([]byte, error) { return p.caPEM, nil }},
		{p.caKey, func() ([]byte, error) { return privateKeyPEM(caKey) }},
		{p.servingCert, func() ([]byte, error) { return servingPEM, nil }},
		{p.servingKey, func() ([]byte, error) { return privateKeyPEM(servingKey) }},
		{p.saKey, func() ([]byte, error) { return privateKeyPEM(saKey) }},
		{p.saPub, func() ([]byte, error) { return publicKeyPEM(saKey.Public()) }},
		{p.tokens, func() ([]byte, error) { return tokenFile(users), nil }},
	}
	for _, f := range files {
		data, err := f.data()
		if err == nil {
			err = os.WriteFile(f.path, data, 0o600)
		}
		if err != nil {
			return nil, err
		}
	}
	return p, nil
}

func privateKeyPEM(key crypto.Signer) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

func publicKeyPEM(key crypto.PublicKey) ([]byte, error) {
	der, err := x509.MarshalPKIXPublicKey(key)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}), nil
}

// tokenFile renders the --token-auth-file format: token,user,uid,"group1,group2".
func tokenFile(users []staticUser) []byte {
	var b strings.Builder
	for _, u := range users {
		fmt.Fprintf(&b, "%s,%s,uid-%s", u.token, u.name, u.name)
		if len(u.groups) > 0 {
			fmt.Fprintf(&b, ",%q", strings.Join(u.groups, ","))
		}
		b.WriteString("\n")
	}
	return []byte(b.String())
}

func randomToken() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b) // never fails since Go 1.24
	return hex.EncodeToString(b)
}

// writeKubeconfig writes a kubeconfig that authenticates with a bearer token.
func writeKubeconfig(path, server string, caPEM []byte, user, token string) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["volume-agent-test"] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: caPEM}
	cfg.AuthInfos[user] = &clientcmdapi.AuthInfo{Token: token}
	cfg.Contexts["volume-agent-test"] = &clientcmdapi.Context{Cluster: "volume-agent-test", AuthInfo: user}
	cfg.CurrentContext = "volume-agent-test"
	return clientcmd.WriteToFile(*cfg, path)
}
