#!/usr/bin/env bash
# Install FFmpeg (ffmpeg + ffprobe), which `reel preprocess` uses to decode video files and
# `reel sample --vae` / the validation callback use to write MP4s. Optional: without it Reel
# reads GIFs and PNG frames and writes GIFs.
set -euo pipefail
if command -v ffmpeg >/dev/null && command -v ffprobe >/dev/null; then
    echo "ffmpeg is installed: $(ffmpeg -version | head -1)"
    exit 0
fi
sudo_=""
[ "$(id -u)" -ne 0 ] && sudo_="sudo"
if command -v apt-get >/dev/null; then
    $sudo_ apt-get update -q && $sudo_ apt-get install -y -q ffmpeg
elif command -v dnf >/dev/null; then
    $sudo_ dnf install -y ffmpeg
elif command -v brew >/dev/null; then
    brew install ffmpeg
else
    echo "install FFmpeg with your package manager (ffmpeg and ffprobe on PATH)" >&2
    exit 1
fi
ffmpeg -version | head -1
