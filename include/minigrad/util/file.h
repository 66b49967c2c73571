// Writing output files so that a crash never leaves half of one, and checking an output path
// before the work that fills it.
//
//   mg::check_writable("out/run.json", "--json");            // before hours of training
//   mg::write_file_atomic("out/run.json", "{\"loss\": 0.1}\n");  // the old file or the new one
#pragma once

#include <string>

namespace mg {

// Writes `bytes` to `path` atomically (Note [atomic write] in src/util/file.h: a uniquely named
// temp file in the same folder, fsync, rename, fsync of the folder). On failure the temp file is
// removed, the old file is untouched, and mg::Error names the path and the system's reason.
void write_file_atomic(const std::string& path, const std::string& bytes);
// Throws mg::Error, naming `what` (a flag, say) and the reason, when write_file_atomic(path) could
// not even start: the folder is missing, not a folder or not writable, or path is a folder.
// Check an output path before hours of training, not after.
void check_writable(const std::string& path, const std::string& what);
// Removes the temporaries "<name>.tmp.<pid>.<n>" in `dir` whose writer is dead (killed during a
// write); returns how many. Each write also removes those of its own target name; call this on a
// folder that is about to be written again to leave none of any name.
int remove_stale_temporaries(const std::string& dir);

}  // namespace mg
