# The part of the tools' recipes that kube/build.sh and csi/build.sh share
# (sourced, so part of both groups' cache keys).

# lock takes the group's cache directory for this run: concurrent runs (go
# test builds from several packages at once, other checkouts) wait instead
# of building the same binaries into the same files.
lock() { # dir
	mkdir -p "$1"
	if command -v flock >/dev/null; then
		exec 9>"$1/.lock"
		flock 9
	fi
}

# build builds a binary unless it is in the cache, and prints its path.
build() { # out dir, name, module dir, package, ldflags
	local out=$1 name=$2 dir=$3 pkg=$4 ldflags=$5
	if [ ! -x "$out/$name" ]; then
		echo "building $name into $out (cached after the first time)" >&2
		(cd "$dir" && go build -trimpath -ldflags "$ldflags" -o "$out/$name.tmp" "$pkg")
		mv "$out/$name.tmp" "$out/$name"
	fi
	echo "$out/$name"
}

# modversion prints the version of a module that go.mod requires.
modversion() { # go.mod, module path
	awk -v m="$2" '$1 == m { print $2 } $1 == "require" && $2 == m { print $3 }' "$1"
}
