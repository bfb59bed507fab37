#pragma once

// Whether this process is building a job's dataset from its text
// (dataloader.text_file) right now: `tessera train`'s first Ctrl-C stops
// that build at its next chunk (there is no iteration to finish yet), and
// says so.

namespace tessera {

bool BuildingDatasetFromText();

}  // namespace tessera
