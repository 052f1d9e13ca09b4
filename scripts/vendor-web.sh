#!/usr/bin/env bash
# Refresh web/vendor/ from npm: the page's Markdown renderer, sanitizer and code
# highlighter, and the /schema viewer. Nothing is fetched at run time; the files are committed.
#   scripts/vendor-web.sh        (needs npm; change a version below, run, commit)
# `npm pack` downloads the published tarball and checks it against the registry's
# integrity hash; no package scripts run. Only the files the page loads are kept,
# with each package's licence.
set -euo pipefail
cd "$(dirname "$0")/.."

MARKED=18.3.0
DOMPURIFY=3.5.0
SWAGGER_UI_DIST=5.35.0
# highlight.js's own minified builds; es/highlight.min.js is its "common" set of ~37
# languages as one ES module (129 kB, 43 kB gzipped).
HIGHLIGHTJS=11.12.0
# The page's sign-in through an OpenID Connect provider (authorization code + PKCE): its browser
# build, one script that defines the global `oidc` (its one dependency, jwt-decode, bundled in).
OIDC_CLIENT_TS=3.5.0

out=web/vendor
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

fetch() {  # fetch NAME VERSION -> $work/NAME/package
    mkdir -p "$work/$1"
    (cd "$work/$1" && npm pack "$1@$2" --silent >/dev/null && tar xzf ./*.tgz)
}

fetch marked "$MARKED"
fetch dompurify "$DOMPURIFY"
fetch swagger-ui-dist "$SWAGGER_UI_DIST"
fetch @highlightjs/cdn-assets "$HIGHLIGHTJS"
fetch oidc-client-ts "$OIDC_CLIENT_TS"

rm -rf "$out/marked" "$out/dompurify" "$out/swagger-ui-dist" "$out/highlightjs" "$out/oidc-client-ts"
mkdir -p "$out/marked" "$out/dompurify" "$out/swagger-ui-dist" "$out/highlightjs" "$out/oidc-client-ts"
cp "$work/marked/package/lib/marked.esm.js" "$work/marked/package/LICENSE" "$out/marked/"
cp "$work/dompurify/package/dist/purify.es.mjs" "$work/dompurify/package/LICENSE" "$out/dompurify/"
for f in swagger-ui-bundle.js swagger-ui-bundle.js.LICENSE.txt swagger-ui-standalone-preset.js \
         swagger-ui-standalone-preset.js.LICENSE.txt swagger-ui.css LICENSE NOTICE; do
    cp "$work/swagger-ui-dist/package/$f" "$out/swagger-ui-dist/"
done
cp "$work/@highlightjs/cdn-assets/package/es/highlight.min.js" "$work/@highlightjs/cdn-assets/package/LICENSE" "$out/highlightjs/"
cp "$work/oidc-client-ts/package/dist/browser/oidc-client-ts.min.js" "$work/oidc-client-ts/package/LICENSE" "$out/oidc-client-ts/"

cat > "$out/VERSIONS" <<VERSIONS
# package          version   licence                 files (from the npm tarball)
marked             $MARKED    MIT                     lib/marked.esm.js, LICENSE
dompurify          $DOMPURIFY     MPL-2.0 OR Apache-2.0   dist/purify.es.mjs, LICENSE
swagger-ui-dist    $SWAGGER_UI_DIST    Apache-2.0              swagger-ui-bundle.js, swagger-ui-standalone-preset.js, swagger-ui.css (+ LICENSE, NOTICE, *.LICENSE.txt)
@highlightjs/cdn-assets $HIGHLIGHTJS BSD-3-Clause      es/highlight.min.js (highlight.js, "common" languages), LICENSE
oidc-client-ts     $OIDC_CLIENT_TS     Apache-2.0              dist/browser/oidc-client-ts.min.js (jwt-decode bundled), LICENSE
VERSIONS
echo "web/vendor: marked $MARKED, dompurify $DOMPURIFY, swagger-ui-dist $SWAGGER_UI_DIST, highlight.js $HIGHLIGHTJS, oidc-client-ts $OIDC_CLIENT_TS"
